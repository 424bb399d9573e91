"""The tokenizer manager: renders and tokenises requests in the HTTP process,
sends their prompts to the scheduler over ZMQ and awaits the answers.

A request's parsing, rendering and tokenising run in a worker thread (as
SGLang's serving classes convert requests off the event loop), so a large
request does not hold up the others or ``/health``: the fast tokenizers'
Rust code releases the GIL. A text whose lower bound on tokens
(:class:`~flide_ext.protocol.token_bound.TokenBound`) already passes the
context length is refused before it is tokenised."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from contextlib import nullcontext
from contextvars import ContextVar
from functools import partial
from typing import List, Optional

import numpy as np
import zmq
import zmq.asyncio

from ..protocol.decisions import DecisionRenderer, label_probabilities, parse_decision_request, sgl_decisions
from ..protocol.errors import RequestError
from ..protocol.token_bound import TokenBound
from ..protocol.token_requests import check_labels, check_prompts
from ..runtime.capacity import RoundCapacity
from ..plan.tree import build_prefix_tree
from ..runtime.rounds import tree_size
from .io_struct import Abort, FlushCache, FlushCacheDone, RoundCut, ScoreDone, ScoreWork
from .metrics import Metrics, RequestClock
from .prefix_strategy import SERVED_STRATEGIES, score_question_by_question
from .queue_slots import QueueSlots, SchedulerUnavailable
from .request_ids import RID


# The stages of the HTTP request being answered (set by the HTTP server per
# request; the awaited handlers run in its context).
CLOCK: ContextVar[Optional[RequestClock]] = ContextVar("flide_request_clock", default=None)
# The size in bytes of the body being answered (set by the HTTP server; None: unknown).
BODY_BYTES: ContextVar[Optional[int]] = ContextVar("flide_body_bytes", default=None)
# Bodies up to this size are parsed, checked and tokenised on the event loop: their
# work (tens of microseconds for a RACE or MultiRC request's ids) is shorter than the
# hop to a worker thread and back (measured at 0.3-0.5 ms of a request's latency on
# a server between rounds). Larger ones go to a worker thread, so a long text does
# not hold up the other requests.
INLINE_BODY_BYTES = 16 * 1024


class SchedulerError(RuntimeError):
    """The scheduler could not answer (HTTP 500)."""


class TokenizerManager:
    """Args:
        tokenizer: the model's transformers tokenizer.
        context_length: longest prompt accepted (exclusive), in tokens.
        vocab_size: the model's vocabulary size.
        work_addr: the scheduler's ZMQ PULL address.
        done_addr: this manager's ZMQ PULL address for results.
        metrics: Prometheus metrics to update.
        served_model_name: the model name System One responses carry.
        capacity: the scheduler's round capacity; larger requests are refused here.
        resumes: the scheduler has a state cache: a request larger than a round
            may still fit one once it resumes from the cache, so the scheduler,
            not this manager, refuses it.
        max_queued_requests: most requests sent to the scheduler and not yet
            answered (SGLang's ``--max-queued-requests``); one more is refused
            at once (:data:`~.queue_slots.QUEUE_FULL`, HTTP 503). None: no limit.
        request_timeout: seconds a request may take, from when its body was
            read, before it is withdrawn and answered 504 (``--request-timeout``;
            None: no limit); applied by the HTTP server, which owns the request.
        abort_addr: the scheduler's ZMQ PULL address for Aborts read while a
            round runs (:mod:`.withdrawals`); None: a running round is never cut.
        strategy: ``--execution-strategy`` (``prefix_cache`` needs ``resumes``).
    """

    def __init__(self, tokenizer, context_length: int, vocab_size: int, work_addr: str, done_socket, metrics: Metrics,
                 served_model_name: str = "default", capacity: RoundCapacity = RoundCapacity(),
                 resumes: bool = False, max_queued_requests: Optional[int] = None,
                 request_timeout: Optional[float] = None, abort_addr: Optional[str] = None,
                 strategy: str = SERVED_STRATEGIES[0]):
        from ..protocol.systemone import SystemOneRenderer

        self.tokenizer = tokenizer
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.renderer = DecisionRenderer(tokenizer, context_length)
        self.bound = TokenBound(tokenizer)
        self.systemone = SystemOneRenderer(self.renderer, served_model_name)
        self.context = zmq.asyncio.Context.instance()
        self.work = self.context.socket(zmq.PUSH)
        # No high-water mark: a send never waits (ZMQ's default stops at 1,000
        # queued messages), so fail() reaches every request, however many are sent.
        self.work.setsockopt(zmq.SNDHWM, 0)
        self.work.connect(work_addr)
        self.aborts = None
        if abort_addr is not None:
            self.aborts = self.context.socket(zmq.PUSH)
            self.aborts.setsockopt(zmq.SNDHWM, 0)
            self.aborts.connect(abort_addr)
        self.done = done_socket
        self.pending: dict[int, asyncio.Future] = {}
        self.rids = itertools.count()
        self.metrics = metrics
        self.capacity = capacity
        self.resumes = resumes
        self.strategy = strategy
        # Why the scheduler can no longer answer (its process exited, stopped
        # answering, or a round passed the watchdog limit); None while it can.
        self.scheduler_error: Optional[str] = None
        self.request_timeout = request_timeout
        self.slots = QueueSlots(max_queued_requests, metrics)  # client requests sent and not yet answered
        self.last_answer = 0.0  # time.monotonic() of the scheduler's latest answer
        self._receiver: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self._receiver is None:
            self._receiver = asyncio.get_running_loop().create_task(self._receive())

    async def _receive(self) -> None:
        while True:
            done = await self.done.recv_pyobj()  # ScoreDone, FlushCacheDone or RoundCut
            self.last_answer = time.monotonic()
            if done.cache is not None:
                self.metrics.cache(done.cache)
            if isinstance(done, RoundCut):  # its clients are gone: nobody to answer
                self.metrics.cancelled_rounds.inc()
                continue
            future = self.pending.pop(done.rid, None)
            if future is not None and not future.done():  # a client may have gone away
                future.set_result(done)

    @staticmethod
    async def _encode(encode, body):
        size = BODY_BYTES.get()
        if size is not None and size <= INLINE_BODY_BYTES:
            return encode(body)
        return await asyncio.to_thread(encode, body)

    def fail(self, reason: str) -> None:
        """The scheduler can no longer answer (``reason``, a sentence): every
        awaited answer and every later request raises SchedulerUnavailable
        (HTTP 503); ``/health`` answers 503. The first reason stays."""
        if self.scheduler_error is None:
            self.scheduler_error = reason
        for future in self.pending.values():
            if not future.done():
                future.set_exception(SchedulerUnavailable(self.scheduler_error))

    async def _ask(self, make, queued: bool = False):
        # Send make(rid) to the scheduler and await the answer with that rid;
        # ``queued`` (a client's score request, not /health_generate's probe nor
        # a part of a client's request) holds a queue slot. Cancelled (its client
        # went away, or it timed out), it is withdrawn from the scheduler.
        if self.scheduler_error is not None:
            raise SchedulerUnavailable(self.scheduler_error)
        with self.slots.held() if queued else nullcontext():
            self.start()
            rid = next(self.rids)
            future = asyncio.get_running_loop().create_future()
            self.pending[rid] = future
            try:
                await self.work.send_pyobj(make(rid))
                return await future
            except asyncio.CancelledError:
                # Not sent yet, waiting or running (cancelling the task cancelled the
                # future too): the scheduler drops it if it still waits, and stops its
                # running round if no other request of it is awaited.
                self.work.send_pyobj(Abort(rid))  # not awaited: a cancelled task sends without waiting
                if self.aborts is not None:
                    self.aborts.send_pyobj(Abort(rid))
                raise
            finally:
                self.pending.pop(rid, None)

    async def score(self, prompts: List, labels: List[List[int]], field: str = "prompts",
                    over_labels: bool = False) -> ScoreDone:
        """Run one request's prompts in the scheduler's next round (resuming from
        the state cache, and leaving its state there; ``prefix_cache``: :mod:`.prefix_strategy`).

        Args:
            prompts: token-id lists or ``[n]`` int64 arrays, checked against the
                vocabulary and context already.
            labels: label token ids per prompt.
            field: the request field the prompts came from, named in errors.
            over_labels: answer log-probabilities normalised over each prompt's
                labels (all a softmax over them needs) instead of the vocabulary.

        Raises:
            RequestError: on ``field``, when the prompts nest too deep or no round
                can hold the request (even resuming from the state cache).
            SchedulerError: the round failed.
            SchedulerUnavailable: the scheduler failed or the server is
                stopping (now or while the request waited), or the queue is full.
        """
        if self.strategy == "prefix_cache":  # one slot, one count; its parts (the state, each question) neither
            with self.slots.held():
                return await score_question_by_question(partial(self._score_round, part=True), prompts, labels,
                                                        field, over_labels, CLOCK.get(), self.metrics)
        return await self._score_round(prompts, labels, field, over_labels)

    async def _score_round(self, prompts: List, labels: List[List[int]], field: str, over_labels: bool,
                           part: bool = False) -> ScoreDone:
        prompts = [np.asarray(p, dtype=np.int64) for p in prompts]
        tree = build_prefix_tree([0] * len(prompts), prompts)  # the one the HTTP process builds
        size = tree_size(tree, field)
        if not self.resumes:
            self.capacity.check(size, field)
        clock = None if part else CLOCK.get()
        if clock is not None:
            clock.lap("tokenize")
        request_id = RID.get()
        done: ScoreDone = await self._ask(lambda rid: ScoreWork.pack(rid, prompts, labels, size, field,
                                                                     tree.shared_tokens, request_id, over_labels),
                                          queued=not part)
        if clock is not None:
            clock.stages.update(done.stages)
            clock.lap("transport")  # the whole round trip, less the scheduler's stages
            clock.stages["transport"] -= sum(done.stages.values())
        if done.error_field is not None:
            raise RequestError(done.error_field, done.error)
        if done.error:
            raise SchedulerError(done.error)
        if not part:
            self.metrics.tokens(sum(len(p) for p in prompts), done.stream_tokens, done.cached_tokens)
        return done

    async def flush_cache(self) -> FlushCacheDone:
        """Empty the scheduler's state cache between two rounds; the answer's
        ``error`` says why it failed. Never refused for a full queue.

        Raises:
            SchedulerUnavailable: the scheduler failed or the server is stopping.
        """
        return await self._ask(FlushCache)

    def _precheck(self, values, field: str, before: int = 0) -> int:
        # Refuse texts (as SGLang renders them into one prompt) whose token bound,
        # with ``before`` (a bound on the prompt's other tokens), passes the
        # context length, before anything tokenises them; -> their bound.
        if not self.bound.enabled:
            return 0
        try:
            text = "".join(v if isinstance(v, str) else sgl_decisions.render_text(v)
                           for v in (values if isinstance(values, list) else [values]) if v is not None)
        except Exception:  # noqa: BLE001 - refused, naming the field, where it is rendered
            return 0
        return self.bound.check(text, field, self.context_length, before)

    def _encode_decision(self, body):
        request = parse_decision_request(body)
        before = self._precheck(request.input, "input")
        for i, q in enumerate(request.questions):  # each question's prompt holds the input and its own texts
            options = getattr(q, "options", None) or []
            texts = [q.question, *(getattr(q, "levels", None) or []), getattr(q, "yes", None), getattr(q, "no", None),
                     *(o.name for o in options), *(o.description for o in options)]
            self._precheck(texts, f"questions[{i}]", before)
        return request, self.renderer.encode(request)

    async def decide(self, body):
        """A ``/v1/decisions`` body -> SGLang DecisionResponse, its usage's
        ``prompt_tokens_details.cached_tokens`` filled. Raises RequestError."""
        request, encoded = await self._encode(self._encode_decision, body)
        done = await self.score([q.prompt_ids for q in encoded], [q.label_ids for q in encoded], field="questions")
        response = self.renderer.respond(request, encoded, done.label_logprobs)
        response.usage.prompt_tokens_details = _cached(done)
        return response

    def _encode_systemone(self, body):
        request = self.systemone.parse(body)
        self._precheck(request.state, "state")
        views, encoded = self.systemone.encode(request)
        return request, views, encoded

    async def decide_systemone(self, body):
        """A ``/v1/systemone`` body -> SGLang SystemOneResponse (whose usage has no
        cached-token field). Raises RequestError."""
        request, views, encoded = await self._encode(self._encode_systemone, body)
        done = await self.score([q.prompt_ids for q in encoded], [q.label_ids for q in encoded], field="questions")
        return self.systemone.respond(request, views, encoded, done.label_logprobs)

    def _ids(self, value, field: str, special: bool, before: int = 0, check: bool = True) -> np.ndarray:
        # -> [n] int64: a text tokenised, or token ids checked against the vocabulary
        # (unless ``check`` is false: the caller checks many at once, _check_vocab).
        # ``before``: a bound on the tokens the prompt has besides these.
        if isinstance(value, str):
            if not value:
                raise RequestError(field, "is empty")
            self.bound.check(value, field, self.context_length, before)
            return np.asarray(self.tokenizer.encode(value, add_special_tokens=special), dtype=np.int64)
        try:  # pydantic has made every id a Python int already
            ids = np.asarray(value, dtype=np.int64)
        except OverflowError:
            ids = None
        if ids is None or (check and ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size)):
            raise RequestError(field, f"token ids must be integers in [0, {self.vocab_size})")
        return ids

    def _check_vocab(self, arrays: List[np.ndarray], field: str) -> None:
        # Every id of ``arrays`` in the vocabulary, in one pass over them all (two
        # reductions per item cost more than the ids of a short item); the first
        # bad item is named.
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= self.vocab_size):
            for i, ids in enumerate(arrays):
                self._ids(ids, f"{field}[{i}]", special=False)

    async def probe(self) -> None:
        """Run a one-token prompt through the scheduler's next round (SGLang's
        ``/health_generate`` generates one token); returns once the scheduler has
        answered, whatever its answer. Counts nothing in the metrics."""
        one = np.zeros(1, dtype=np.int64)
        await self._ask(lambda rid: ScoreWork.pack(rid, [one], [[0]], None, "health"))

    def _encode_score(self, body):
        from sglang.srt.entrypoints.openai.protocol import ScoringRequest

        from ..protocol.errors import validate_model

        request = validate_model(ScoringRequest, body)
        unsupported = {
            "score_extraction_token": request.score_extraction_token,
            "return_pooled_hidden_states": request.return_pooled_hidden_states or None,
            "embed_override_token_id": request.embed_override_token_id,
        }
        for name, value in unsupported.items():
            if value is not None:
                raise RequestError(name, "is not supported by Flide's /v1/score")
        if request.items is None or request.items == [] or request.items == "":
            raise RequestError("items", "give at least one item")
        if request.label_token_ids is None:
            raise RequestError("label_token_ids", "is required for a causal LM")
        if request.temperature != 1.0 and not request.apply_softmax:
            raise RequestError("temperature", "requires apply_softmax=true")
        items = [request.items] if isinstance(request.items, str) else request.items
        query = self._ids(request.query or [], "query", special=True)
        item_ids = [self._ids(item, f"items[{i}]", special=False, before=len(query), check=False)
                    for i, item in enumerate(items)]
        self._check_vocab(item_ids, "items")
        # One [n] int64 array per prompt: the query is not copied id by id into
        # Python lists, however long it is.
        prompts = [np.concatenate((ids, query) if request.item_first else (query, ids)) for ids in item_ids]
        labels = request.label_token_ids
        per_item = bool(labels) and isinstance(labels[0], list)
        check_prompts(prompts, None, self.context_length, field="items")  # every id checked above
        check_labels(labels, len(prompts), self.vocab_size)
        label_lists = [labels[i] if per_item else labels for i in range(len(prompts))]
        return request, prompts, label_lists

    async def score_request(self, body):
        """A ``/v1/score`` body -> SGLang ScoringResponse. Each item is scored as
        its own query+item prompt (no delimiter token), forked from the shared query.

        Raises:
            RequestError: naming the offending field.
        """
        from sglang.srt.entrypoints.openai.protocol import ScoringResponse, UsageInfo

        request, prompts, label_lists = await self._encode(self._encode_score, body)
        # Scores normalised over the labels need only the labels' logits; the
        # token log-probabilities and unnormalised scores are the vocabulary's.
        over_labels = bool(request.apply_softmax) and not request.return_token_logprobs
        done = await self.score(prompts, label_lists, field="items", over_labels=over_labels)
        if request.apply_softmax:
            scores = [label_probabilities(lp, request.temperature) for lp in done.label_logprobs]
        else:
            scores = [[math.exp(x) for x in lp] for lp in done.label_logprobs]
        prompt_tokens = sum(len(p) for p in prompts)
        return ScoringResponse(
            scores=scores,
            token_logprobs=done.label_logprobs if request.return_token_logprobs else None,
            model=request.model,
            usage=UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens,
                            prompt_tokens_details=_cached(done)),
        )


def _cached(done: ScoreDone):
    """SGLang's ``usage.prompt_tokens_details``: the tokens resumed from the cache."""
    from sglang.srt.entrypoints.openai.protocol import PromptTokensDetails

    return PromptTokensDetails(cached_tokens=done.cached_tokens)
