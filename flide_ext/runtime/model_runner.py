"""The model runner: one model's weights, its GDN state pool, its CUDA graphs,
and the forward pass of a planned round.

The engine above it decides what a round holds (requests, checkpoints to resume
from and keep); the runner computes it: it assigns the round's GDN state slots,
runs the model (a flat graph's replay or the same kernels eagerly) and hands
back the labels' log-probabilities.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch

from ..assets.builtin_models import resolve_model_path
from ..kernels.dispatch import environment_backend
from ..layers.readout import normalised_over_labels
from ..models.base import RESIDUAL_DTYPE
from ..models.loader import check_gpu_support, load_model
from ..plan.flat import FlatPlan
from ..protocol.errors import ModelLoadError
from .cache_budget import cache_sizes, default_cache_bytes, round_working_bytes
from .capacity import RoundCapacity
from .determinism import enable_deterministic
from .graph_capacities import GraphCapacity, default_capacities
from .graph_runner import MODES, GraphRunner
from .kv_pool import KVPool
from .precision import parse_residual_dtype
from .state_pool import StatePool

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    """``"float32"``, ``"bfloat16"``, ``"float16"`` or a torch dtype -> the torch dtype.

    Raises:
        ValueError: an unknown dtype name.
    """
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        return DTYPES[dtype]
    return dtype


def check_device(device) -> torch.device:
    """The torch device, if Flide can run there.

    Raises:
        ModelLoadError: not a torch device, CUDA asked for where there is none, or
            a device type other than cpu and cuda.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ModelLoadError(f"device {device!r} is not a torch device: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {str(device)!r}: no CUDA device is available here")
    if device.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"device {str(device)!r}: only cpu and cuda are supported")
    return device


class ModelRunner:
    """One model ready to run rounds.

    Args:
        model_path: a checkpoint directory or built-in model name (ignored when
            ``model`` is given, except as its name).
        dtype: weights' and activations' torch dtype.
        device: where the model runs (checked by :func:`check_device`).
        round_capacity: the largest round (sizes the state pool and the graphs).
        state_cache_bytes: memory of the state cache (K/V rows and GDN slots
            of cached states, :func:`~.cache_budget.cache_sizes`), 0 for no cache, None for
            :func:`~.cache_budget.default_cache_bytes`.
        model: an already built Flide model to run instead of loading one. The
            runner sets its GDN rule and residual dtypes: runners sharing one
            model share them (the last one built sets them).
        cuda_graphs: ``"flat"``, ``"per_shape"`` or ``"off"``
            (:mod:`~flide_ext.runtime.graph_runner`); default ``"flat"`` on CUDA.
        graph_capacities: the flat graphs' capacities (default
            :func:`~flide_ext.runtime.graph_capacities.default_capacities` of the round capacity).
        deterministic: turn deterministic mode on first (:func:`~.determinism.enable_deterministic`);
            ``self.deterministic`` then says what it did (None: off).
        gdn_rule_dtype: the dtype GDN layers run their gated delta rule in (None:
            ``dtype``; :meth:`~flide_ext.models.base.FlatCausalLM.set_gdn_rule_dtype`).
        residual_dtype: ``"float32"`` or ``"model"`` (:func:`~.precision.parse_residual_dtype`;
            :meth:`~flide_ext.models.base.FlatCausalLM.set_residual_dtype`); None:
            :data:`~flide_ext.models.base.RESIDUAL_DTYPE` (float32).

    The kernel backend is decided here, once: the references when
    ``FLIDE_REFERENCE_KERNELS`` is set, else by device for a loaded model, and
    the given model's own otherwise (:mod:`flide_ext.kernels.dispatch`).

    Raises:
        ModelLoadError: the model cannot be found or loaded, the device does not
            exist, or the state cache's budget cannot be allocated there.
        RuntimeError: deterministic mode cannot be enabled on this device.
        ValueError: an unknown graph mode, graphs on a CPU device, or graph
            capacities that are empty, larger than a round, or given without flat graphs.
    """

    def __init__(
        self,
        model_path: str,
        dtype: torch.dtype,
        device: Union[str, torch.device],
        round_capacity: RoundCapacity,
        state_cache_bytes: Optional[int] = 0,
        model=None,
        cuda_graphs: Optional[str] = None,
        graph_capacities: Optional[Sequence[GraphCapacity]] = None,
        deterministic: bool = False,
        gdn_rule_dtype: Optional[torch.dtype] = None,
        residual_dtype: Optional[str] = None,
    ):
        self.device = check_device(device)
        residual = RESIDUAL_DTYPE if residual_dtype is None else parse_residual_dtype(residual_dtype)
        on_gpu = self.device.type == "cuda"
        cuda_graphs = cuda_graphs or ("flat" if on_gpu else "off")
        if cuda_graphs not in MODES:
            raise ValueError(f"cuda_graphs {cuda_graphs!r} is not one of {', '.join(MODES)}")
        if cuda_graphs != "off" and not on_gpu:
            raise ValueError(f"cuda_graphs {cuda_graphs!r} needs a CUDA device")
        if graph_capacities is not None:
            if cuda_graphs != "flat":
                raise ValueError(f"graph_capacities only apply to cuda_graphs 'flat', not {cuda_graphs!r}")
            big = [c for c in graph_capacities if c.tokens > round_capacity.tokens
                   or c.segments > round_capacity.segments]
            if not graph_capacities or big:
                raise ValueError(f"graph capacities must be a non-empty list within the round capacity "
                                 f"({round_capacity.tokens} tokens, {round_capacity.segments} segments)"
                                 + (f"; {big[0]} is larger" if big else ""))
        self.dtype = dtype
        if model is None:
            self.path = resolve_model_path(model_path)
            self.model, _ = load_model(self.path, dtype, self.device)
        else:
            check_gpu_support(type(model), type(model).__name__, self.device, model.config)
            self.path, self.model = model_path, model
        # A model handed in keeps the backend it was given unless the
        # environment asks for the references.
        backend = environment_backend()
        if model is None or backend is not None:
            self.model.set_kernel_backend(backend)
        self.model.set_gdn_rule_dtype(gdn_rule_dtype)
        self.model.set_residual_dtype(residual)
        self.config = self.model.config  # the text part, for multimodal checkpoints
        self.vocab_size = self.model.token_vocab_size
        self.state_pool = self.kv_pool = None
        if state_cache_bytes is None:
            state_cache_bytes = default_cache_bytes(self.device, round_working_bytes(self.model, dtype, round_capacity))
        self.state_cache_bytes = state_cache_bytes
        self.cache_rows, self.cache_slots, self.slot_bytes = cache_sizes(self.model, dtype, state_cache_bytes)
        if state_cache_bytes:
            # The cache's rows, plus a whole round's (a round's stream K/V are
            # written to the pool before the cache keeps some of them).
            try:
                self.kv_pool = KVPool(self.model.attention_shapes(), dtype, self.device,
                                      self.cache_rows + round_capacity.tokens)
            except RuntimeError as e:  # out of memory, on the CPU or the GPU
                raise ModelLoadError(f"the state cache's budget of {state_cache_bytes} bytes cannot be allocated "
                                     f"on {self.device} ({str(e).splitlines()[0]}); give a smaller budget "
                                     "(--state-cache-gb) or --disable-radix-cache") from None
        if self.model.num_gdn_layers:
            recurrent_shape, conv_shape = self.model.gdn_state_shapes()
            # The CPU float32 reference keeps recurrent states in float64, so a state
            # handed from parent to child (or kept as a checkpoint) loses no bits
            # against running the whole prompt at once.
            exact = self.device.type == "cpu" and dtype == torch.float32
            # On the GPU the pool starts with a slot for every request of a full
            # round plus every checkpoint, so it rarely grows (growing replaces
            # its tensors, and CUDA graphs over them are captured again).
            slots = round_capacity.requests + self.cache_slots if on_gpu else 8
            self.state_pool = StatePool(
                recurrent_shape, conv_shape, self.model.num_gdn_layers, dtype, self.device, capacity=max(slots, 1),
                recurrent_dtype=torch.float64 if exact else torch.float32,
            )
        # Before any graph is captured: a graph keeps the kernels it was captured with.
        self.deterministic = (enable_deterministic(self.device, self.model, round_capacity.tokens, round_capacity.segments)
                              if deterministic else None)
        self.graphs = None
        if on_gpu:
            # A state cut at a checkpoint adds a level: the lean graphs get one.
            capacities = graph_capacities or default_capacities(round_capacity.tokens, round_capacity.segments,
                                                                 lean_levels=3 if self.kv_pool is not None else 2)
            self.graphs = GraphRunner(self.model, self.state_pool, capacities, cuda_graphs, self.kv_pool)
            with torch.inference_mode():
                self.graphs.capture()

    @property
    def plan_device(self) -> torch.device:
        """Where a round's plan is built: on the host when it reaches the device
        in one copy with every kernel's tables (:mod:`.round_buffers`)."""
        return torch.device("cpu") if self.graphs is not None else self.device

    def release_slot(self, slots) -> None:
        """Return GDN state slots to the pool (nothing for attention-only models)."""
        if self.state_pool is not None:
            self.state_pool.release(slots)

    def assign_slots(self, plan: FlatPlan, settle: Optional[Callable[[], bool]] = None) -> list[int]:
        """Give the segments whose final state someone reads a state slot: the
        parents (a state cut into tiers at checkpoints makes each tier a parent).

        Args:
            plan: the round's plan.
            settle: called first when the pool has too few free slots: completes
                the rounds in flight, so that their slots come back before the
                pool grows (growing replaces its tensors: graphs are captured
                again). None: never.

        Returns:
            Per real segment its slot, -1 for none (empty for models without GDN layers).
        """
        if self.state_pool is None:
            return []
        needed = {seg.parent for seg in plan.tree.segments if seg.parent >= 0}
        if settle is not None and self.state_pool.num_free < len(needed):
            settle()
        taken = iter(self.state_pool.allocate(len(needed)))
        slots = [next(taken) if s in needed else -1 for s in range(plan.num_segments)]
        plan.assign_slots(slots)
        return slots

    def forward(self, plan: FlatPlan, cancelled: Optional[Callable[[], bool]] = None
                ) -> tuple[torch.Tensor, Optional[GraphCapacity]]:
        """Run a planned round (slots assigned; K/V rows assigned when the runner
        has a K/V pool), up to the LM head: :meth:`readout` reads its output.

        Args:
            plan: the round's plan.
            cancelled: asked before each layer of an eager forward and before a
                graph's replay (which then runs whole: a round of milliseconds);
                true stops the round (None: never).

        Returns:
            ``(out, graph)``: ``out`` the ``[>= R, hidden]`` normed readout rows
            on the device, in the LM head's dtype, whose first R rows are the
            readout rows (``[>= R, vocab]`` float32 log-probabilities when the
            model's selective readout is off); ``graph`` the graph capacity
            replayed, or None when the round ran eagerly.

        Raises:
            ForwardCancelled: ``cancelled()`` was true; the plan's K/V rows and
                slots hold half a round.
        """
        if self.graphs is None:
            return self.model(plan, self.state_pool, self.kv_pool, cancelled,
                              normed=self.model.selective_readout), None
        return self.graphs.run(plan, cancelled)

    def forward_marks(self) -> tuple:
        """``(tables_seconds, events)`` of the last :meth:`forward`: the host's
        padding, tables and copy of a replayed round (0 for an eager one) and the
        CUDA events around the forward on the GPU's stream, which
        :func:`~.launched_round.span_ms` reads; ``(0.0, None)`` without graphs (CPU).
        Taken right after the forward, before another round's."""
        if self.graphs is None:
            return 0.0, None
        host_ms, events = self.graphs.last_marks()
        return host_ms / 1e3, events

    def readout(self, out: torch.Tensor, rows: Sequence[int], labels: Sequence[Sequence[int]],
                over_labels: Sequence[bool]) -> "Readout":
        """Queue a round's readout on the device behind its forward and its copy
        to the host, without waiting: per prompt, the log-probabilities of its
        labels over the whole vocabulary (the LM head's full product and
        log-softmax), or, where ``over_labels`` says so, over its labels alone
        (only their logits: :func:`~flide_ext.layers.readout.normalised_over_labels`).
        :func:`collect` waits for them. A later round's forward may be queued
        meanwhile: it writes ``out`` only after these reads, on the same stream.

        Args:
            out: :meth:`forward`'s output for the round.
            rows: per prompt, its row in ``out``.
            labels: per prompt, its label token ids.
            over_labels: per prompt, whether it is normalised over its labels.

        Raises:
            ValueError: a label id outside the vocabulary (the kernels do not check).
        """
        vocab = self.model.lm_head.weight.shape[0]
        flat = [label for ids in labels for label in ids]
        if flat and (min(flat) < 0 or max(flat) >= vocab):  # C loops: a round may hold thousands
            raise ValueError(f"label token ids must be integers in [0, {vocab})")
        parts = []
        if not self.model.selective_readout:  # ``out`` holds the log-probabilities already
            parts.append((list(range(len(rows))), _picked(out, rows, labels), over_labels))
            return Readout(len(rows), labels, parts, _recorded(out.device))
        full = [i for i, own in enumerate(over_labels) if not own]
        mine = [i for i, own in enumerate(over_labels) if own]
        if full:
            picked = torch.tensor([rows[i] for i in full], dtype=torch.long).to(out.device, non_blocking=True)
            logprobs = self.model.head_logprobs(out.index_select(0, picked))
            parts.append((full, _picked(logprobs, range(len(full)), [labels[i] for i in full]), [False] * len(full)))
        if mine:
            pairs = torch.tensor([[rows[i] for i in mine for _ in labels[i]], [l for i in mine for l in labels[i]]],
                                 dtype=torch.long).to(out.device, non_blocking=True)
            logits = self.model.label_logits(out, pairs[0], pairs[1])
            parts.append((mine, logits.to("cpu", non_blocking=True), [True] * len(mine)))
        return Readout(len(rows), labels, parts, _recorded(out.device))


class Readout:
    """A round's readout queued on the device (:meth:`ModelRunner.readout`):
    per part, the prompts it answers, their label values on their way to the
    host (flat, prompt by prompt) and whether each is normalised over its labels."""

    def __init__(self, prompts: int, labels, parts: list, copied):
        self.prompts, self.labels, self.parts, self.copied = prompts, labels, parts, copied


def collect(readout: Readout) -> list:
    """Wait for a :class:`Readout` and return, per prompt, its labels'
    log-probabilities as Python floats."""
    if readout.copied is not None:
        readout.copied.synchronize()
    answers: list = [None] * readout.prompts
    for prompts, values, normalised in readout.parts:
        for i, v, own in zip(prompts, _by_prompt(values.tolist(), [readout.labels[i] for i in prompts]), normalised):
            answers[i] = normalised_over_labels(v) if own else v
    return answers


def _recorded(device: torch.device):
    # A CUDA event behind the copies just queued (None on the CPU, where they are done).
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def _picked(logprobs: torch.Tensor, rows: Sequence[int], labels: Sequence[Sequence[int]]) -> torch.Tensor:
    # The values of each prompt's labels in its row of ``logprobs`` [>= R, vocab],
    # flat, prompt by prompt, on their way to the host (pinned, not waited for).
    flat_rows = [row for row, ids in zip(rows, labels) for _ in ids]
    flat_ids = [i for ids in labels for i in ids]
    index = torch.tensor([flat_rows, flat_ids], dtype=torch.long).to(logprobs.device, non_blocking=True)
    return logprobs[index[0], index[1]].to("cpu", non_blocking=True)


def _by_prompt(values: list, labels: Sequence[Sequence[int]]) -> list:
    # The flat per-label ``values`` split into one list per prompt, as many as its labels.
    out, at = [], 0
    for ids in labels:
        out.append(values[at:at + len(ids)])
        at += len(ids)
    return out
