"""The Engine: one model, rounds of decision requests in and answers out.

A batch of requests is one round when it fits one: all their prompts are merged
into one prefix tree per request and run as one flat stream, with one readout
row per distinct prompt. A request that cannot be answered gets a
:class:`~flide_ext.protocol.errors.RequestError` in its place and is left out;
the others are answered as if it had never been sent.

The engine decides what a round holds (the requests, the checkpoints they resume
from and keep); the :class:`~.model_runner.ModelRunner` computes it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, List, Optional, Sequence, Union

import torch

from ..plan.flat import plan_round
from ..protocol.errors import ModelLoadError, RequestError
from ..protocol.token_requests import TokenAnswer, TokenRequest, check_token_request, parse_token_request
from .capacity import RoundCapacity
from .checkpoints import CheckpointStore, keep_states, resume_from
from .graph_runner import GraphCapacity
from .model_runner import ModelRunner, parse_dtype
from .round_result import BatchAnswers, RoundResult, RoundStats
from .rounds import RoundQueue, request_size


def _serialised(method):
    """Run an Engine method under the engine's lock (one round at a time)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


def _only(answers: list):
    """The one answer of a one-request batch; its RequestError is raised."""
    if isinstance(answers[0], RequestError):
        raise answers[0]
    return answers[0]


class Engine:
    """Flide's decision engine over one model.

    Args:
        model_path: a Hugging Face checkpoint directory (config.json + safetensors)
            or a built-in model name (``smollm2-135m``).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (or a torch dtype).
        device: torch device for weights and compute (``"cpu"``, ``"cuda"``).
        context_length: longest prompt, in tokens, accepted (exclusive); defaults to
            and may not exceed the model's ``max_position_embeddings``.
        tokenizer_path: tokenizer directory, if not the model's own.
        checkpoint_capacity: states kept as checkpoints (least recently used
            evicted first); requests resume from them automatically.
        checkpoint_max_tokens: total tokens all kept checkpoints may cover (their
            K/V memory), evicting least recently used first.
        model: an already built Flide model (e.g.
            :func:`flide_ext.assets.random_checkpoints.random_model`) to serve instead of
            loading ``model_path``, which then only names it (benchmarks).
        round_capacity: most stream tokens, segments and requests per round
            (:class:`~flide_ext.runtime.rounds.RoundCapacity`); the batch methods
            split their requests into rounds within it and refuse a request no
            round can hold.
        cuda_graphs: ``"flat"`` (CUDA graphs over a few stream capacities,
            captured at start), ``"per_shape"`` (one graph per round shape,
            captured when first seen) or ``"off"``
            (:mod:`~flide_ext.runtime.graph_runner`); default ``"flat"`` on CUDA.
            Only ``"off"`` is possible on the CPU.
        graph_capacities: the flat graphs' capacities (default
            :func:`~flide_ext.runtime.graph_runner.default_capacities` of the round capacity).

    Raises:
        ModelLoadError: the model cannot be found or loaded, or the device does not exist.
        ValueError: an unknown dtype, or a context length below 1.

    One engine serves one round at a time; calls from several threads wait for
    each other.
    """

    def __init__(
        self,
        model_path: str,
        dtype: Union[str, torch.dtype] = "float32",
        device: Union[str, torch.device] = "cpu",
        context_length: Optional[int] = None,
        tokenizer_path: Optional[str] = None,
        checkpoint_capacity: int = 64,
        checkpoint_max_tokens: int = 1 << 18,
        round_capacity: Optional[RoundCapacity] = None,
        model=None,
        cuda_graphs: Optional[str] = None,
        graph_capacities: Optional[Sequence[GraphCapacity]] = None,
    ):
        dtype = parse_dtype(dtype)
        if context_length is not None and context_length < 1:
            raise ValueError(f"context_length {context_length} must be at least 1")
        for name, value in (("checkpoint_capacity", checkpoint_capacity), ("checkpoint_max_tokens", checkpoint_max_tokens)):
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
        self.round_capacity = round_capacity or RoundCapacity()
        self.runner = ModelRunner(model_path, dtype, device, self.round_capacity, checkpoint_capacity, model,
                                  cuda_graphs, graph_capacities)
        self.dtype, self.device = dtype, self.runner.device
        self.path, self.config = self.runner.path, self.runner.config
        self.vocab_size = self.runner.vocab_size
        limit = int(getattr(self.config, "max_position_embeddings", 0) or 1 << 30)
        self.context_length = min(context_length or limit, limit)
        self.tokenizer_path = tokenizer_path or str(self.path)
        self._renderer = None
        self.checkpoints = CheckpointStore(checkpoint_capacity, self.runner.release_slot, checkpoint_max_tokens)
        self._lock = threading.RLock()

    @property
    def model(self):
        """The model runner's Flide model."""
        return self.runner.model

    @property
    def graphs(self):
        """The model runner's :class:`~.graph_runner.GraphRunner` (None on the CPU)."""
        return self.runner.graphs

    @property
    def state_pool(self):
        """The model runner's GDN :class:`~.state_pool.StatePool` (None without GDN layers)."""
        return self.runner.state_pool

    @property
    def renderer(self):
        """The DecisionRenderer for this model's tokenizer (loaded on first use).

        Raises:
            ModelLoadError: the model has no tokenizer.
        """
        if self._renderer is None:
            from transformers import AutoTokenizer

            from ..protocol.decisions import DecisionRenderer

            try:
                tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
            except (OSError, ValueError) as e:
                raise ModelLoadError(f"no tokenizer at {self.tokenizer_path!r}: {e}") from e
            self._renderer = DecisionRenderer(tokenizer, self.context_length)
        return self._renderer

    @_serialised
    @torch.inference_mode()
    def run_round(
        self,
        groups: Sequence[tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]],
        keep_state: Optional[Sequence[bool]] = None,
    ) -> RoundResult:
        """Run one round: each group is one request's ``(prompts, label ids per prompt)``.

        Args:
            groups: the round's requests.
            keep_state: per request, whether to keep its state (the prefix all its
                prompts share) as a checkpoint for later requests that extend it.

        Returns:
            The round's :class:`~.round_result.RoundResult`: per request, per
            prompt, the full-vocabulary log-probability of each of its labels;
            stream tokens, resumed and kept checkpoint tokens per request; stats.
        """
        keep_state = list(keep_state or [False] * len(groups))
        requests, prompts, labels = [], [], []
        for r, (group_prompts, group_labels) in enumerate(groups):
            requests += [r] * len(group_prompts)
            prompts += [list(p) for p in group_prompts]
            labels += [list(l) for l in group_labels]
        n = len(groups)
        if not prompts:
            return RoundResult([[] for _ in groups], [0] * n, [0] * n, [0] * n, RoundStats(requests=n), [None])

        resumed, resume, kv_prefix = resume_from(self.checkpoints, groups)
        plan = plan_round(requests, prompts, self.runner.plan_device, resume)
        slots = self.runner.assign_slots(plan, keep_state)
        capture = [] if any(keep_state) else None
        kept_segments, kept_tokens = set(), {}
        try:
            logprobs, graph = self.runner.forward(plan, kv_prefix, capture)  # [>= R, vocab] on the device
            label_logprobs = self.runner.gather_labels(logprobs, plan.prompt_readout.tolist(), labels)
            kept_segments, kept_tokens = keep_states(self.checkpoints, plan, groups, keep_state, resumed, slots,
                                                     capture, self.device)
        finally:
            self.runner.release_slot([slot for s, slot in enumerate(slots) if slot >= 0 and s not in kept_segments])

        stream = [0] * n
        for seg in plan.tree.segments:
            stream[seg.request] += len(seg.tokens)
        answers: List[List[List[float]]] = [[] for _ in groups]
        for r, values in zip(requests, label_logprobs):
            answers[r].append(values)
        stats = RoundStats(
            requests=n,
            questions=len(prompts),
            prompt_tokens=sum(len(p) for p in prompts),
            stream_tokens=plan.num_tokens,
            segments=plan.num_segments,
            levels=plan.num_levels,
            resumed_tokens=sum(len(c) for c in resumed.values()),
        )
        return RoundResult(answers, stream, [len(resumed[r]) if r in resumed else 0 for r in range(n)],
                           [kept_tokens.get(r, 0) for r in range(n)], stats, [graph])

    @_serialised
    def clear_checkpoints(self) -> None:
        """Forget every checkpoint (and free their state slots)."""
        self.checkpoints.clear()

    # -- batches: as many rounds as the capacity needs ---------------------------

    def _queue(self, items: list, prompts_of, field: str) -> tuple[list, RoundQueue]:
        # Each request no round can hold becomes its RequestError, in place; the
        # others (by index among those kept) wait in one round queue.
        out, queue, kept = [], RoundQueue(self.round_capacity), 0
        for item in items:
            if not isinstance(item, RequestError):
                try:
                    queue.put(kept, request_size(prompts_of(item)), field)
                    kept += 1
                except RequestError as e:
                    item = e
            out.append(item)
        return out, queue

    def _run_queue(self, groups: list, keep_state: list, queue: RoundQueue) -> RoundResult:
        # The queue's items index ``groups``; rounds run until it is empty.
        n = len(groups)
        out = RoundResult([None] * n, [0] * n, [0] * n, [0] * n)
        while len(queue):
            taken = queue.next_round()
            result = self.run_round([groups[i] for i in taken], [keep_state[i] for i in taken])
            for j, i in enumerate(taken):
                out.answers[i], out.stream_tokens[i] = result.answers[j], result.stream_tokens[j]
                out.resumed_tokens[i], out.kept_tokens[i] = result.resumed_tokens[j], result.kept_tokens[j]
            out.stats = out.stats.plus(result.stats)
            out.graphs += result.graphs
        return out

    @_serialised
    def run_rounds(self, groups, keep_state: Optional[Sequence[bool]] = None) -> RoundResult:
        """:meth:`run_round` for any number of requests: packed into as many rounds
        as :attr:`round_capacity` needs, by the round queue the scheduler uses.

        Returns:
            One :class:`~.round_result.RoundResult` over all rounds, per request in
            the order given (``graphs`` has one entry per round).

        Raises:
            RequestError: a request larger than a round (naming ``prompts``).
            ValueError: ``keep_state`` does not have one entry per request.
        """
        keep = list(keep_state or [False] * len(groups))
        if len(keep) != len(groups):
            raise ValueError(f"keep_state has {len(keep)} entries for {len(groups)} requests")
        checked, queue = self._queue(list(groups), lambda g: g[0], "prompts")
        refused = next((item for item in checked if isinstance(item, RequestError)), None)
        if refused is not None:
            raise refused
        return self._run_queue(list(groups), keep, queue)

    # -- low-level form: token ids in, label log-probabilities out ---------------

    def score_tokens(self, request: Union[TokenRequest, dict]) -> TokenAnswer:
        """Answer one TokenRequest. Raises RequestError for bad input."""
        return _only(self.score_tokens_batch([request]))

    @_serialised
    def score_tokens_batch(self, requests: Sequence[Any]) -> BatchAnswers:
        """Answer TokenRequests in as few rounds as fit; bad ones get their
        RequestError in place.

        Returns:
            :class:`~.round_result.BatchAnswers`: per request its TokenAnswer or
            RequestError, and the rounds' stats.
        """
        from ..protocol.decisions import label_mass, label_probabilities

        parsed: list = []
        for obj in requests:
            try:
                req = parse_token_request(obj)
                check_token_request(req, self.vocab_size, self.context_length)
                parsed.append(req)
            except RequestError as e:
                parsed.append(e)
        checked, queue = self._queue(parsed, lambda r: r.prompts, "prompts")
        good = [r for r in checked if not isinstance(r, RequestError)]
        result = self._run_queue([(r.prompts, [r.labels_for(i) for i in range(len(r.prompts))]) for r in good],
                                 [r.checkpoint for r in good], queue)
        out, j = BatchAnswers(stats=result.stats), 0
        for req in checked:
            if isinstance(req, RequestError):
                out.append(req)
                continue
            logprobs = result.answers[j]
            out.append(
                TokenAnswer(
                    label_logprobs=logprobs,
                    probabilities=[label_probabilities(lp, req.temperature) for lp in logprobs],
                    label_mass=[label_mass(lp) for lp in logprobs],
                    prompt_tokens=sum(len(p) for p in req.prompts),
                    resumed_tokens=result.resumed_tokens[j],
                    checkpoint_tokens=result.kept_tokens[j],
                )
            )
            j += 1
        return out

    # -- SGLang /v1/decisions form ---------------------------------------------

    def decide(self, request: Any):
        """Answer one SGLang DecisionRequest (model or dict) with a DecisionResponse.

        Raises:
            RequestError: naming the offending field.
        """
        return _only(self.decide_batch([request]))

    @_serialised
    def decide_batch(self, requests: Sequence[Any]) -> BatchAnswers:
        """Answer DecisionRequests in as few rounds as fit.

        Returns:
            :class:`~.round_result.BatchAnswers`: one entry per request, in order
            (its DecisionResponse, or the RequestError that kept it out), and the
            rounds' stats.
        """
        from ..protocol.decisions import parse_decision_request

        renderer = self.renderer
        prepared: list = []
        for obj in requests:
            try:
                req = parse_decision_request(obj)
                prepared.append((req, renderer.encode(req)))
            except RequestError as e:
                prepared.append(e)
        checked, queue = self._queue(prepared, lambda p: [q.prompt_ids for q in p[1]], "questions")
        good = [p for p in checked if not isinstance(p, RequestError)]
        result = self._run_queue([([q.prompt_ids for q in enc], [q.label_ids for q in enc]) for _, enc in good],
                                 [False] * len(good), queue)
        out, j = BatchAnswers(stats=result.stats), 0
        for item in checked:
            if isinstance(item, RequestError):
                out.append(item)
            else:
                req, enc = item
                out.append(renderer.respond(req, enc, result.answers[j]))
                j += 1
        return out
