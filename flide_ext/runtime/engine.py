"""The Engine: load a model once, answer rounds of decision requests.

A batch of requests is one round: all their prompts are merged into one prefix
tree (per request) and run as one flat stream, with one readout row per distinct
prompt. A request that cannot be answered gets a :class:`RequestError` in its
place and is left out of the round; the others are answered as if it had never
been sent.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Union

import torch

from ..assets.builtin_models import resolve_model_path
from ..protocol.errors import ModelLoadError, RequestError
from ..models.loader import load_model
from ..plan.flat import Resume, plan_round
from ..protocol.token_requests import TokenAnswer, TokenRequest, check_token_request, parse_token_request
from .checkpoints import Checkpoint, CheckpointStore, concat_kv
from .graph_runner import MODES, GraphCapacity, GraphRunner, default_capacities
from .round_buffers import device_round
from .rounds import RoundCapacity, pack_round, request_size
from .state_pool import StatePool

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check_device(device) -> torch.device:
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ModelLoadError(f"device {device!r} is not a torch device: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {str(device)!r}: no CUDA device is available here")
    if device.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"device {str(device)!r}: only cpu and cuda are supported")
    return device


def _serialised(method):
    """Run an Engine method under the engine's lock (one round at a time)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


@dataclass
class RoundStats:
    """What one round computed.

    Attributes:
        requests: requests answered in the round.
        questions: prompts answered (one per question).
        prompt_tokens: sum of every question's full prompt length (what one
            sequence per question would compute).
        stream_tokens: tokens in the flat stream (what Flide computed).
        segments: segments in the prefix tree.
        levels: depth of the deepest tree + 1.
        resumed_tokens: state tokens not recomputed because a request resumed
            from a checkpoint (counted once per request).
    """

    requests: int = 0
    questions: int = 0
    prompt_tokens: int = 0
    stream_tokens: int = 0
    segments: int = 0
    levels: int = 0
    resumed_tokens: int = 0

    @property
    def tokens_saved(self) -> int:
        return self.prompt_tokens - self.stream_tokens

    def plus(self, other: "RoundStats") -> "RoundStats":
        """Two rounds' stats together (counts add; levels is the deeper one's)."""
        return RoundStats(
            requests=self.requests + other.requests, questions=self.questions + other.questions,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens, stream_tokens=self.stream_tokens + other.stream_tokens,
            segments=self.segments + other.segments, levels=max(self.levels, other.levels),
            resumed_tokens=self.resumed_tokens + other.resumed_tokens,
        )


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
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise ValueError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
            dtype = _DTYPES[dtype]
        if context_length is not None and context_length < 1:
            raise ValueError(f"context_length {context_length} must be at least 1")
        for name, value in (("checkpoint_capacity", checkpoint_capacity), ("checkpoint_max_tokens", checkpoint_max_tokens)):
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
        self.round_capacity = round_capacity or RoundCapacity()
        self.device = _check_device(device)
        on_gpu = self.device.type == "cuda"
        cuda_graphs = cuda_graphs or ("flat" if on_gpu else "off")
        if cuda_graphs not in MODES:
            raise ValueError(f"cuda_graphs {cuda_graphs!r} is not one of {', '.join(MODES)}")
        if cuda_graphs != "off" and not on_gpu:
            raise ValueError(f"cuda_graphs {cuda_graphs!r} needs a CUDA device")
        if graph_capacities is not None and cuda_graphs != "flat":
            raise ValueError(f"graph_capacities only apply to cuda_graphs 'flat', not {cuda_graphs!r}")
        self.dtype = dtype
        if model is None:
            self.path = resolve_model_path(model_path)
            self.model, self.config = load_model(self.path, dtype, self.device)
        else:
            self.path, self.model = model_path, model
        self.config = self.model.config  # the text part, for multimodal checkpoints
        self.vocab_size = int(self.config.vocab_size)
        limit = int(getattr(self.config, "max_position_embeddings", 0) or 1 << 30)
        self.context_length = min(context_length or limit, limit)
        self.tokenizer_path = tokenizer_path or str(self.path)
        self._renderer = None
        self.last_round = RoundStats()
        self.last_graph = None  # the graph capacity the last round replayed (None: eager)
        self.state_pool = None
        if self.model.num_gdn_layers:
            recurrent_shape, conv_shape = self.model.gdn_state_shapes()
            # The CPU float32 reference keeps recurrent states in float64, so a state
            # handed from parent to child (or kept as a checkpoint) loses no bits
            # against running the whole prompt at once.
            exact = self.device.type == "cpu" and dtype == torch.float32
            # On the GPU the pool starts with a slot for every request of a full
            # round plus every checkpoint, so it rarely grows (growing replaces
            # its tensors, and CUDA graphs over them are captured again).
            slots = self.round_capacity.requests + checkpoint_capacity if on_gpu else 8
            self.state_pool = StatePool(
                recurrent_shape, conv_shape, self.model.num_gdn_layers, dtype, self.device, capacity=max(slots, 1),
                recurrent_dtype=torch.float64 if exact else torch.float32,
            )
        release = self.state_pool.release if self.state_pool is not None else (lambda slots: None)
        self.checkpoints = CheckpointStore(checkpoint_capacity, release, checkpoint_max_tokens)
        self._lock = threading.RLock()
        self.graphs = None
        if graph_capacities is not None:
            big = [c for c in graph_capacities if c.tokens > self.round_capacity.tokens
                   or c.segments > self.round_capacity.segments]
            if not graph_capacities or big:
                raise ValueError(f"graph capacities must be a non-empty list within the round capacity "
                                 f"({self.round_capacity.tokens} tokens, {self.round_capacity.segments} segments)"
                                 + (f"; {big[0]} is larger" if big else ""))
        if on_gpu:
            capacities = graph_capacities or default_capacities(self.round_capacity.tokens,
                                                                self.round_capacity.segments)
            self.graphs = GraphRunner(self.model, self.state_pool, capacities, cuda_graphs)
            with torch.inference_mode():
                self.graphs.capture()

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
    ):
        """Run one round: each group is one request's ``(prompts, label ids per prompt)``.

        Args:
            groups: the round's requests.
            keep_state: per request, whether to keep its state (the prefix all its
                prompts share) as a checkpoint for later requests that extend it.

        Returns:
            For each group, for each prompt, the full-vocabulary log-probability of
            each of its labels (Python floats from float32 log-softmax). Details of
            checkpoints used and kept are in ``self.last_checkpoints``: per request
            ``(resumed_tokens, kept_tokens)``.
        """
        keep_state = list(keep_state or [False] * len(groups))
        requests, prompts, labels = [], [], []
        for r, (group_prompts, group_labels) in enumerate(groups):
            requests += [r] * len(group_prompts)
            prompts += [list(p) for p in group_prompts]
            labels += [list(l) for l in group_labels]
        self.last_round = RoundStats(requests=len(groups), questions=len(prompts))
        self.last_checkpoints = [(0, 0)] * len(groups)  # (resumed, kept) tokens per request
        self.last_request_stream_tokens = [0] * len(groups)
        if not prompts:
            return [[] for _ in groups]

        resumed: dict[int, Checkpoint] = {}
        if len(self.checkpoints):
            for r, (group_prompts, _) in enumerate(groups):
                ckpt = self.checkpoints.longest_prefix(group_prompts)
                if ckpt is not None:
                    resumed[r] = ckpt
        resume, offset = {}, 0
        for r in sorted(resumed):
            self.last_checkpoints[r] = (len(resumed[r]), 0)
            resume[r] = Resume(len(resumed[r]), resumed[r].slot, offset)
            offset += len(resumed[r])
        kv_prefix = None
        if resumed:
            layers = len(next(iter(resumed.values())).kv)
            kv_prefix = [
                (torch.cat([resumed[r].kv[i][0] for r in sorted(resumed)]),
                 torch.cat([resumed[r].kv[i][1] for r in sorted(resumed)]))
                for i in range(layers)
            ]

        # On the GPU the plan is built on the host and reaches the device in one
        # copy with every kernel's tables (round_buffers).
        plan = plan_round(requests, prompts, "cpu" if self.graphs is not None else self.device, resume)
        slots = []
        if self.state_pool is not None:
            # Only segments whose final state someone reads get a slot: parents,
            # and the roots of requests that keep their state.
            needed = {seg.parent for seg in plan.tree.segments if seg.parent >= 0}
            needed |= {s for s, seg in enumerate(plan.tree.segments) if seg.parent < 0 and keep_state[seg.request]}
            taken = iter(self.state_pool.allocate(len(needed)))
            slots = [next(taken) if s in needed else -1 for s in range(plan.num_segments)]
            plan.assign_slots(slots)
        capture = [] if any(keep_state) else None
        kept: set = set()
        try:
            logprobs = self._forward(plan, kv_prefix, capture)  # [>= R, vocab] on the device
            label_logprobs = self._gather_labels(logprobs, plan.prompt_readout.tolist(), labels)
            kept = self._keep_checkpoints(plan, groups, keep_state, resumed, slots, capture)
        finally:
            if self.state_pool is not None:
                self.state_pool.release([slot for s, slot in enumerate(slots) if slot >= 0 and s not in kept])

        for seg in plan.tree.segments:
            self.last_request_stream_tokens[seg.request] += len(seg.tokens)
        answers: List[List[List[float]]] = [[] for _ in groups]
        for r, values in zip(requests, label_logprobs):
            answers[r].append(values)
        self.last_round = RoundStats(
            requests=len(groups),
            questions=len(prompts),
            prompt_tokens=sum(len(p) for p in prompts),
            stream_tokens=plan.num_tokens,
            segments=plan.num_segments,
            levels=plan.num_levels,
            resumed_tokens=sum(len(c) for c in resumed.values()),
        )
        return answers

    def _forward(self, plan, kv_prefix, capture) -> torch.Tensor:
        if self.graphs is None:
            return self.model(plan, self.state_pool, kv_prefix, capture)
        if kv_prefix is None and capture is None:
            logprobs, self.last_graph = self.graphs.run(plan)
            return logprobs
        # Checkpoints (a varying key prefix, captured K/V) run eagerly.
        self.last_graph = None
        device_plan = device_round(plan, self.graphs.spec, self.device)
        return self.model(device_plan, self.state_pool, kv_prefix, capture)

    def _gather_labels(self, logprobs: torch.Tensor, rows: list, labels: list) -> list:
        # Only the labels' log-probabilities leave the device.
        flat_rows = [row for row, ids in zip(rows, labels) for _ in ids]
        flat_ids = [i for ids in labels for i in ids]
        index = torch.tensor([flat_rows, flat_ids], dtype=torch.long).to(logprobs.device, non_blocking=True)
        values = logprobs[index[0], index[1]].tolist()
        out, at = [], 0
        for ids in labels:
            out.append(values[at:at + len(ids)])
            at += len(ids)
        return out

    def _keep_checkpoints(self, plan, groups, keep_state, resumed, slots, capture) -> set:
        """Store the states asked for; returns the segments whose slots now belong
        to checkpoints."""
        kept = set()
        if capture is None:
            return kept
        roots: dict[int, list[int]] = {}
        for s, seg in enumerate(plan.tree.segments):
            if seg.parent < 0:
                roots.setdefault(seg.request, []).append(s)
        for r, keep in enumerate(keep_state):
            base = resumed.get(r)
            if not keep or len(roots.get(r, [])) != 1:
                continue  # a request whose prompts part at once shares no state
            s = roots[r][0]
            start, length = int(plan.seg_start[s]), int(plan.seg_len[s])
            base_len = len(base) if base is not None else 0
            tokens = tuple(groups[r][0][0][: base_len + length])
            rows = torch.arange(start, start + length, device=self.device)
            slot = slots[s] if slots else -1
            if self.checkpoints.add(Checkpoint(tokens, slot, concat_kv(base, capture, rows))):
                kept.add(s)
            if tokens in self.checkpoints.entries:  # kept now or already (not refused by the budget)
                self.last_checkpoints[r] = (base_len, len(tokens))
        return kept

    @_serialised
    def clear_checkpoints(self) -> None:
        """Forget every checkpoint (and free their state slots)."""
        self.checkpoints.clear()

    # -- low-level form: token ids in, label log-probabilities out ---------------

    def score_tokens(self, request: Union[TokenRequest, dict]) -> TokenAnswer:
        """Answer one TokenRequest. Raises RequestError for bad input."""
        result = self.score_tokens_batch([request])[0]
        if isinstance(result, RequestError):
            raise result
        return result

    @_serialised
    def score_tokens_batch(self, requests: Sequence[Any]) -> List[Union[TokenAnswer, RequestError]]:
        """Answer TokenRequests in one round; bad ones get their RequestError in place."""
        from ..protocol.decisions import label_mass, label_probabilities

        parsed: List[Union[TokenRequest, RequestError]] = []
        for obj in requests:
            try:
                req = parse_token_request(obj)
                check_token_request(req, self.vocab_size, self.context_length)
                parsed.append(req)
            except RequestError as e:
                parsed.append(e)
        sized, sizes = self._sized(parsed, lambda r: r.prompts, "prompts")
        answered = iter(self._run_in_rounds(
            [(r.prompts, [r.labels_for(i) for i in range(len(r.prompts))]) for r in sized if isinstance(r, TokenRequest)],
            [r.checkpoint for r in sized if isinstance(r, TokenRequest)],
            sizes,
        ))
        out: List[Union[TokenAnswer, RequestError]] = []
        for req in sized:
            if isinstance(req, RequestError):
                out.append(req)
                continue
            logprobs, (resumed_tokens, kept_tokens) = next(answered)
            out.append(
                TokenAnswer(
                    label_logprobs=logprobs,
                    probabilities=[label_probabilities(lp, req.temperature) for lp in logprobs],
                    label_mass=[label_mass(lp) for lp in logprobs],
                    prompt_tokens=sum(len(p) for p in req.prompts),
                    resumed_tokens=resumed_tokens,
                    checkpoint_tokens=kept_tokens,
                )
            )
        return out

    def _sized(self, items: list, prompts_of, field: str) -> tuple[list, list]:
        # Each request no round can hold becomes its RequestError, in place; the
        # sizes of the others, in order, go on to the round packing.
        out, sizes = [], []
        for item in items:
            if not isinstance(item, RequestError):
                size = request_size(prompts_of(item))
                try:
                    self.round_capacity.check(size, field)
                    sizes.append(size)
                except RequestError as e:
                    item = e
            out.append(item)
        return out, sizes

    @_serialised
    def run_rounds(self, groups, keep_state: Optional[Sequence[bool]] = None):
        """:meth:`run_round` for any number of requests: packed into as many rounds
        as :attr:`round_capacity` needs, as the scheduler packs waiting requests.

        Raises:
            RequestError: a request larger than a round (naming ``prompts``).
            ValueError: ``keep_state`` does not have one entry per request.
        """
        keep = list(keep_state or [False] * len(groups))
        if len(keep) != len(groups):
            raise ValueError(f"keep_state has {len(keep)} entries for {len(groups)} requests")
        sized, sizes = self._sized(list(groups), lambda g: g[0], "prompts")
        refused = next((item for item in sized if isinstance(item, RequestError)), None)
        if refused is not None:
            raise refused
        done = self._run_in_rounds(list(groups), keep, sizes)
        self.last_checkpoints = [details for _, details in done]
        return [logprobs for logprobs, _ in done]

    def _run_in_rounds(self, groups: list, keep_state: list, sizes: list) -> list:
        """Run requests of the given sizes (:func:`~flide_ext.runtime.rounds.request_size`)
        in as many rounds as the capacity needs, packed in order
        (:func:`~flide_ext.runtime.rounds.pack_round`); per request
        ``(label log-probabilities, (resumed_tokens, kept_tokens))``."""
        results: list = [None] * len(groups)
        waiting = list(range(len(groups)))
        total = RoundStats()
        while waiting:
            taken = [waiting[j] for j in pack_round([sizes[i] for i in waiting], self.round_capacity)]
            answers = self.run_round([groups[i] for i in taken], [keep_state[i] for i in taken])
            for i, logprobs, details in zip(taken, answers, self.last_checkpoints):
                results[i] = (logprobs, details)
            chosen = set(taken)
            waiting = [i for i in waiting if i not in chosen]
            total = total.plus(self.last_round)
        self.last_round = total  # the batch's rounds together
        return results

    # -- SGLang /v1/decisions form ---------------------------------------------

    def decide(self, request: Any):
        """Answer one SGLang DecisionRequest (model or dict) with a DecisionResponse.

        Raises:
            RequestError: naming the offending field.
        """
        result = self.decide_batch([request])[0]
        if isinstance(result, RequestError):
            raise result
        return result

    @_serialised
    def decide_batch(self, requests: Sequence[Any]) -> list:
        """Answer DecisionRequests as one round.

        Returns:
            One entry per request, in order: its DecisionResponse, or the
            RequestError that kept it out of the round.
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
        prepared, sizes = self._sized(prepared, lambda p: [q.prompt_ids for q in p[1]], "questions")
        good = [p for p in prepared if not isinstance(p, RequestError)]
        scored = iter(self._run_in_rounds([([q.prompt_ids for q in enc], [q.label_ids for q in enc]) for _, enc in good],
                                          [False] * len(good), sizes))
        out = []
        for item in prepared:
            if isinstance(item, RequestError):
                out.append(item)
            else:
                req, enc = item
                out.append(renderer.respond(req, enc, next(scored)[0]))
        return out
