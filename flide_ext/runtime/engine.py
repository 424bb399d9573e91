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
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch

from ..protocol.errors import ModelLoadError, RequestError
from ..protocol.token_requests import TokenAnswer, TokenRequest, check_token_request, parse_token_request
from .capacity import RequestSize, RoundCapacity
from .checkpoints import round_size
from .state_cache import StateCache
from .graph_capacities import GraphCapacity
from .launched_round import LaunchedRound, complete_round, launch_round
from .model_runner import ModelRunner, parse_dtype
from .round_result import BatchAnswers, RoundResult
from .rounds import RoundQueue, check_per_request, queue_batch


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
        context_length: longest prompt, in tokens, accepted (exclusive); at most (and by
            default) the model's ``max_position_embeddings``.
        tokenizer_path: tokenizer directory, if not the model's own.
        radix_cache: keep every request's state in the state cache (:mod:`~.state_cache`),
            from which later requests that extend it resume; False is SGLang's
            ``--disable-radix-cache``.
        state_cache_bytes: the cache's memory (K/V rows and GDN slots), on top of one
            round's working rows; default :func:`~.cache_budget.default_cache_bytes`.
        model: an already built Flide model to serve instead of loading ``model_path``,
            which then only names it (benchmarks: :func:`~flide_ext.assets.random_checkpoints.random_model`).
        round_capacity: most stream tokens, segments and requests per round
            (:class:`~flide_ext.runtime.rounds.RoundCapacity`); the batch methods split
            their requests into rounds within it and refuse a request no round can hold.
        cuda_graphs: ``"flat"``, ``"per_shape"`` or ``"off"``
            (:mod:`~flide_ext.runtime.graph_runner`); default ``"flat"`` on CUDA,
            only ``"off"`` on the CPU.
        graph_capacities: the flat graphs' capacities (default
            :func:`~flide_ext.runtime.graph_capacities.default_capacities` of the round capacity).
        deterministic: deterministic mode (SGLang's ``--enable-deterministic-inference``,
            :mod:`~.determinism`): on CUDA this engine's GEMMs at row counts checked at start.
        gdn_rule_dtype: the dtype hybrid models' GDN layers run the gated delta rule in
            (``"float32"`` in a bf16 model keeps its chunk states and WY factors in
            float32); None: ``dtype``.
        residual_dtype: the residual stream's, ``"float32"`` or ``"model"`` (its dtype);
            None: :data:`~flide_ext.models.base.RESIDUAL_DTYPE` (float32).

    Raises:
        ModelLoadError: the model cannot be found or loaded, or the device does not exist.
        ValueError: an unknown dtype or residual dtype, or a context length below 1.

    One engine serves one round at a time; calls from several threads wait for each other.
    """

    def __init__(
        self,
        model_path: str,
        dtype: Union[str, torch.dtype] = "float32",
        device: Union[str, torch.device] = "cpu",
        context_length: Optional[int] = None,
        tokenizer_path: Optional[str] = None,
        radix_cache: bool = True,
        state_cache_bytes: Optional[int] = None,
        round_capacity: Optional[RoundCapacity] = None,
        model=None,
        cuda_graphs: Optional[str] = None,
        graph_capacities: Optional[Sequence[GraphCapacity]] = None,
        deterministic: bool = False,
        gdn_rule_dtype: Union[str, torch.dtype, None] = None,
        residual_dtype: Optional[str] = None,
    ):
        dtype = parse_dtype(dtype)
        if context_length is not None and context_length < 1:
            raise ValueError(f"context_length {context_length} must be at least 1")
        if state_cache_bytes is not None and (type(state_cache_bytes) is not int or state_cache_bytes < 1):
            raise ValueError(f"state_cache_bytes must be a positive integer, not {state_cache_bytes!r}")
        self.round_capacity = round_capacity or RoundCapacity()
        self.runner = ModelRunner(model_path, dtype, device, self.round_capacity,
                                  state_cache_bytes if radix_cache else 0, model, cuda_graphs, graph_capacities,
                                  deterministic, None if gdn_rule_dtype is None else parse_dtype(gdn_rule_dtype),
                                  residual_dtype)
        self.deterministic = deterministic
        self.state_cache_bytes = self.runner.state_cache_bytes
        self.dtype, self.device = dtype, self.runner.device
        self.path, self.config = self.runner.path, self.runner.config
        self.vocab_size = self.runner.vocab_size
        limit = int(getattr(self.config, "max_position_embeddings", 0) or 1 << 30)
        self.context_length = min(context_length or limit, limit)
        self.tokenizer_path = tokenizer_path or str(self.path)
        self._renderer = None
        self.cache = None
        if self.state_cache_bytes:
            release = self.runner.release_slot if self.runner.state_pool is not None else None
            self.cache = StateCache(self.runner.kv_pool, release, self.runner.cache_slots, self.runner.slot_bytes,
                                    self.runner.cache_rows)
        self._lock = threading.RLock()
        self._in_flight: list[LaunchedRound] = []  # launched, not yet completed, in launch order
        #: Times the rounds in flight were completed early: by a launch short of
        #: K/V rows or state slots, or by a flush of the cache.
        self.early_completions = 0

    # The model runner's parts: its Flide model, its GraphRunner (None on the CPU)
    # and its GDN StatePool (None without GDN layers).
    model = property(lambda self: self.runner.model)
    graphs = property(lambda self: self.runner.graphs)
    state_pool = property(lambda self: self.runner.state_pool)

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
    def run_round(self, groups: Sequence[tuple], cancelled: Optional[Callable[[], bool]] = None,
                  over_labels: Optional[Sequence[bool]] = None) -> RoundResult:
        """Run one round: each group is one request's ``(prompts, label ids per prompt)``,
        or ``(prompts, labels, state)`` from a caller that has the request's state
        (:func:`~.checkpoints.state_of` of its prompts: the scheduler's ScoreWork).

        With the state cache on, each request resumes from the longest cached checkpoint
        of its state and leaves its own state behind (:mod:`~.checkpoints`).

        Args:
            groups: the round's requests.
            cancelled: asked before each layer of the forward (on CUDA graphs,
                once before the replay, which runs whole); true stops the round.
                The flat stream is shared, so a round runs for all its requests or
                none: true only once none of them is awaited. None: never asked.
            over_labels: per request, whether its answers are normalised over its
                labels alone (only their logits computed), not the vocabulary;
                one flag per request (ValueError otherwise).

        Returns:
            The round's :class:`~.round_result.RoundResult`: per request, per prompt,
            the log-probability of each of its labels over the full vocabulary (or
            its labels); stream tokens, resumed and kept checkpoint tokens; stats.

        Raises:
            RoundCancelled: ``cancelled()`` was true. The round's pool rows and
                slots are free again and it kept no checkpoint (it may have evicted
                some to make room, and marked those it matched as recently used, as
                any round does): later rounds' answers are as without it.
        """
        return self.complete_round(self.launch_round(groups, cancelled, over_labels))

    @_serialised
    @torch.inference_mode()
    def launch_round(self, groups: Sequence[tuple], cancelled: Optional[Callable[[], bool]] = None,
                     over_labels: Optional[Sequence[bool]] = None) -> LaunchedRound:
        """The first half of :meth:`run_round`: plan the round and queue its forward
        and readout on the device without waiting for them
        (:func:`~.launched_round.launch_round`); :meth:`complete_round` gives its
        answers. Another round may be launched in between (the scheduler's
        overlap): answers are as if each had run alone, in launch order.

        A launch short of K/V rows or state slots for want of those the rounds
        in flight hold completes them first (their results are kept for
        :meth:`complete_round`): it then resumes from the cache and the pools do
        not grow, as with rounds one at a time.

        Raises:
            RoundCancelled, ValueError: as :meth:`run_round`.
        """
        launched = launch_round(self.runner, self.cache, groups, cancelled, over_labels, self._settle)
        if launched.done is None:
            self._in_flight.append(launched)
        return launched

    @_serialised
    def complete_round(self, launched: LaunchedRound) -> RoundResult:
        """The second half of :meth:`run_round`: wait for a launched round's
        answers and return its rows and slots (:func:`~.launched_round.complete_round`).
        Rounds are completed in the order they were launched; completing one
        again returns the same result (or raises the same error)."""
        self._in_flight = [f for f in self._in_flight if f is not launched]
        return complete_round(self.runner, launched)

    def _settle(self) -> bool:
        # Complete every round in flight, in launch order; a failure stays with
        # its round (LaunchedRound.error) and reaches whoever completes it.
        flights, self._in_flight = self._in_flight, []
        for launched in flights:
            try:
                complete_round(self.runner, launched)
            except Exception:
                pass
        self.early_completions += bool(flights)
        return bool(flights)

    @_serialised
    def round_size(self, state: np.ndarray, size: RequestSize) -> RequestSize:
        """A request's size in a round run now, less what it would resume from the state
        cache (:func:`~.checkpoints.round_size`); ``size`` when the cache is off.

        Args:
            state: ``[n]`` int64 the request's state (:func:`~.checkpoints.state_of`).
            size: its prefix tree's size (:func:`~.rounds.request_size`).
        """
        return size if self.cache is None else round_size(self.cache, state, size)

    @_serialised
    def flush_cache(self) -> None:
        """Forget every cached state (SGLang's ``/flush_cache``); nothing when the cache is off.
        Rounds in flight are completed first (their results kept for
        :meth:`complete_round`): their kernels may still write the rows and
        slots of the checkpoints they keep."""
        if self.cache is not None:
            self._settle()
            self.cache.flush()

    @_serialised
    def cache_stats(self) -> dict:
        """The state cache's :meth:`~.state_cache.StateCache.stats` and its budget
        (``budget_bytes``, ``max_tokens``, ``max_slots``); ``{"enabled": False}``
        when it is off."""
        if self.cache is None:
            return {"enabled": False}
        return {"enabled": True, **self.cache.stats(), "budget_bytes": self.state_cache_bytes,
                "max_tokens": self.runner.cache_rows, "max_slots": self.runner.cache_slots}

    # -- batches: as many rounds as the capacity needs ---------------------------

    def _run_queue(self, groups: list, queue: RoundQueue, over_labels: Optional[Sequence[bool]] = None) -> RoundResult:
        # The queue's items index ``groups``; rounds run until it is empty.
        n = len(groups)
        out = RoundResult([None] * n, [0] * n, [0] * n, [0] * n)
        while len(queue):
            taken = queue.next_round()
            flags = None if over_labels is None else [over_labels[i] for i in taken]
            result = self.run_round([groups[i] for i in taken], over_labels=flags)
            for j, i in enumerate(taken):
                out.answers[i], out.stream_tokens[i] = result.answers[j], result.stream_tokens[j]
                out.resumed_tokens[i], out.kept_tokens[i] = result.resumed_tokens[j], result.kept_tokens[j]
            out.stats = out.stats.plus(result.stats)
            out.graphs += result.graphs
        return out

    @_serialised
    def run_rounds(self, groups, over_labels: Optional[Sequence[bool]] = None) -> RoundResult:
        """:meth:`run_round` for any number of requests: packed into as many rounds
        as :attr:`round_capacity` needs, by the round queue the scheduler uses
        (``over_labels`` per request, as :meth:`run_round`'s).

        Returns:
            One :class:`~.round_result.RoundResult` over all rounds, per request in
            the order given (``graphs`` has one entry per round).

        Raises:
            RequestError: a request larger than a round (naming ``prompts``).
            ValueError: as :meth:`run_round`.
        """
        groups = list(groups)
        check_per_request(over_labels, len(groups))
        checked, queue = queue_batch(self.round_capacity, groups, lambda g: g[0], "prompts")
        refused = next((item for item in checked if isinstance(item, RequestError)), None)
        if refused is not None:
            raise refused
        return self._run_queue(groups, queue, over_labels)

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
        checked, queue = queue_batch(self.round_capacity, parsed, lambda r: r.prompts, "prompts")
        good = [r for r in checked if not isinstance(r, RequestError)]
        result = self._run_queue([(r.prompts, [r.labels_for(i) for i in range(len(r.prompts))]) for r in good], queue)
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
        checked, queue = queue_batch(self.round_capacity, prepared, lambda p: [q.prompt_ids for q in p[1]], "questions")
        good = [p for p in checked if not isinstance(p, RequestError)]
        result = self._run_queue([([q.prompt_ids for q in enc], [q.label_ids for q in enc]) for _, enc in good], queue)
        out, j = BatchAnswers(stats=result.stats), 0
        for item in checked:
            if isinstance(item, RequestError):
                out.append(item)
            else:
                req, enc = item
                out.append(renderer.respond(req, enc, result.answers[j]))
                j += 1
        return out
