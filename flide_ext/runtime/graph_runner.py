"""Flat CUDA graphs: a few graphs over fixed stream capacities serve every round.

At start the runner captures one CUDA graph per :class:`GraphCapacity` (stream
tokens x segments x readout rows, and tree levels). A graph's inputs are the
static device buffers of a :class:`~.round_buffers.RoundBuffers`: the round's
token ids and positions, its segment table, every kernel's tables and the
readout rows, all padded to the capacity (:mod:`flide_ext.kernels.tables`), so
a round of any mix of requests replays the smallest graph that holds it, or a
larger one whose replay was measured faster at capture
(:func:`~.graph_capacities.faster_graphs`).
Selective readout's final norm on the readout rows is inside the graph; the
LM head runs after the replay (:meth:`~.model_runner.ModelRunner.readout`),
over the vocabulary for the questions that ask for it and over their labels
alone for the others, which no fixed-shape graph could hold.

Modes (the ablation switches):

* ``flat``: the graphs above.
* ``per_shape``: one graph per exact round shape (tokens, segments, levels,
  readout rows), captured the first time that shape is seen, as graph runners
  keyed by batch shape do; a new mix of requests means a new capture.
* ``off``: no graphs; the same kernels and tables, launched one by one.

Rounds that resume from the state cache replay the same graphs: the stream's
K/V go to pool rows named by a static buffer, and keys are read through the
round's ``kv_index``, one static buffer shared by every graph (only its used
part is copied per round). Rounds larger or deeper than every capacity run
eagerly. So do rounds large enough that their own GPU time,
without padding, beats the padded graph's (at capture each graph's replay and
one eager forward of the smallest capacity are timed): their launches hide
behind the GPU work anyway.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import torch

from ..kernels.fork_attention import tokens_per_block
from ..kernels.gated_delta_rule import fla_available
from ..kernels.tables import TableCapacity
from ..models.base import ForwardCancelled
from ..plan.flat import FlatPlan, plan_round
from .graph_capacities import GraphCapacity, faster_graphs
from .round_buffers import RoundBuffers, device_round

logger = logging.getLogger(__name__)

MODES = ("flat", "per_shape", "off")
# Programs per value head and block of one inter-chunk launch in a graph
# (each takes every LEVEL_PROGRAMS-th segment of its level).
LEVEL_PROGRAMS = 256
# Graphs per_shape mode keeps (least recently used dropped first).
PER_SHAPE_GRAPHS = 16
# Replays timed (their median kept) for each graph of up to TIMED_TOKENS rows at
# capture; larger graphs, whose replay takes longer than their launches, are timed once.
REPLAY_TIMINGS, TIMED_TOKENS = 5, 8192


@dataclass(frozen=True)
class TableSpec:
    """What the kernel tables need to know of a model.

    Attributes:
        conv_width: the GDN conv kernel width (1 without GDN layers).
        block_sizes: ForkAttention's stream rows per program, ascending, one
            entry per tile shape among the model's attention layers (Gemma 4's
            sliding and full layers may need two).
    """

    conv_width: int
    block_sizes: tuple[int, ...]

    @classmethod
    def of(cls, model, dtype: torch.dtype) -> "TableSpec":
        width = 1
        for layer in model.model.layers:
            mixer = getattr(layer, "linear_attn", None)
            if mixer is not None:
                width = mixer.kernel
                break
        blocks = {tokens_per_block(attn.head_dim, dtype, attn.num_heads // attn.num_kv_heads)
                  for attn in (layer.self_attn for layer in model.model.layers if hasattr(layer, "self_attn"))}
        return cls(width, tuple(sorted(blocks)))

    def level_programs(self, capacity: Optional[TableCapacity]) -> Optional[int]:
        return None if capacity is None else min(capacity.segments + 1, LEVEL_PROGRAMS)


def graphs_supported(model) -> bool:
    """True when every kernel of ``model``'s forward can run inside a CUDA graph:
    the Triton kernels, not the references (a model loaded with the reference
    backend: they read tables on the host), and fla-core's chunk steps for GDN
    layers (without them the GDN pass runs level by level, sized on the host)."""
    return model.kernel_backend != "reference" and (model.num_gdn_layers == 0 or fla_available())


class _Graph:
    def __init__(self, capacity: GraphCapacity):
        self.capacity = capacity
        self.buffers: Optional[RoundBuffers] = None
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.plan: Optional[FlatPlan] = None  # the device plan over the buffers
        self.output: Optional[torch.Tensor] = None
        self.replay_ms = 0.0  # its replay's wall time, measured after capture (GraphRunner._time_replay)


class GraphRunner:
    """Runs rounds of one model through CUDA graphs over static buffers.

    Args:
        model: the Flide model (on a CUDA device).
        state_pool: the engine's GDN StatePool (None for attention-only models);
            its tensors must not be replaced while graphs live (the runner
            recaptures when the pool grows).
        capacities: the flat graphs' capacities (``flat`` mode).
        mode: one of :data:`MODES`.
        kv_pool: the engine's :class:`~.kv_pool.KVPool`, or None (no state cache).

    Attributes:
        capture_seconds: wall time of the last :meth:`capture` (flat mode).
        capture_log: seconds per graph of the last :meth:`capture`, largest first.
        replays, eager_rounds, captures: counts since start.
        eager: while true, every round runs eagerly (graphs held as they are).
        eager_by_cost: of the eager rounds, those a graph held but whose own
            estimated GPU time beat the graph's measured replay.
        launch_ms: wall time of one eager forward of the smallest capacity.
    """

    def __init__(self, model, state_pool, capacities: Sequence[GraphCapacity], mode: str = "flat", kv_pool=None):
        if mode not in MODES:
            raise ValueError(f"graph mode {mode!r} is not one of {', '.join(MODES)}")
        if mode != "off" and not graphs_supported(model):
            logger.warning("CUDA graphs need the Triton kernels with fla-core (GDN models) and no forced "
                           "reference kernels; running without graphs")
            mode = "off"
        self.model, self.state_pool, self.mode, self.kv_pool = model, state_pool, mode, kv_pool
        self.device = model.lm_head.weight.device
        self.dtype = model.lm_head.weight.dtype
        self.spec = TableSpec.of(model, self.dtype)
        self.capacities = sorted(set(capacities), key=lambda c: (c.tokens, c.segments, c.levels))
        self._graphs: dict = {}  # flat graphs by capacity
        self._shaped: "OrderedDict[GraphCapacity, _Graph]" = OrderedDict()  # per_shape graphs
        self._pool = None
        self._stream = None
        # Every graph writes its normed readout rows into one shared buffer (one
        # graph replays at a time), so graphs do not each keep their own.
        self._output: Optional[torch.Tensor] = None
        self.launch_ms = 0.0  # an eager forward of the smallest capacity: launch-bound time
        self._pool_generation = self._generation()
        self.capture_seconds = 0.0
        self.capture_log: list[float] = []
        self.replays = self.eager_rounds = self.eager_by_cost = self.captures = 0
        self.last_host_ms = 0.0  # host time of the last round's tables and copy (0 when it ran eagerly)
        self._events = None  # CUDA events around the last round's forward (its GPU time)
        self._keys = None
        self._keys_copied = None  # CUDA event: the last round's key rows left the pinned buffer
        self._faster: Optional[dict] = None  # faster_graphs() of the captured graphs, made at the first pick
        self.eager = False  # every round runs eagerly while set (the warm-up's eager rounds)
        if kv_pool is not None:
            # Key-array rows (pool row, logical position) of a graph round: any
            # prefix the pool holds, then the largest stream.
            size = kv_pool.rows + 1 + max(c.tokens for c in self.capacities)
            pin = self.device.type == "cuda"
            self._keys = (torch.zeros(2, size, dtype=torch.long, device=self.device),
                          torch.zeros(2, size, dtype=torch.long, pin_memory=pin))

    def _with_keys(self, device_plan: FlatPlan) -> FlatPlan:
        if self._keys is None:
            return device_plan
        keys = self._keys[0]
        return replace(device_plan, kv_index=keys[0], kv_positions=keys[1], _level_tables=None)

    def _write_keys(self, plan: FlatPlan) -> None:
        # Only the round's own key rows are copied; the graph's kernels read no
        # others (every key range is in the round's segment table).
        n = int(plan.kv_index.numel())
        device, host = self._keys
        if self._keys_copied is not None:
            # The round launched before may still be copying from the pinned rows.
            self._keys_copied.synchronize()
        host[0, :n].copy_(plan.kv_index)
        host[1, :n].copy_(plan.kv_positions)
        # Row by row: each slice is contiguous, one asynchronous copy from pinned
        # memory; a [2, n] slice of the [2, size] buffers is strided, which torch
        # first copies into a new contiguous host tensor, not pinned.
        for row in range(2):
            device[row, :n].copy_(host[row, :n], non_blocking=device.device.type == "cuda")
        if device.device.type == "cuda":
            self._keys_copied = torch.cuda.Event()
            self._keys_copied.record()

    def _generation(self):
        return getattr(self.state_pool, "generation", 0)

    def capture(self) -> float:
        """Capture every flat graph (largest first, sharing one memory pool);
        returns the seconds it took. Nothing to do in the other modes."""
        if self.mode != "flat":
            return 0.0
        start = time.perf_counter()
        self.capture_log = []
        self._faster = None
        for capacity in sorted(self.capacities, key=lambda c: -c.tokens):
            t0 = time.perf_counter()
            self._capture(capacity)
            self.capture_log.append(time.perf_counter() - t0)
        # The launch-bound time of the smallest token capacity, timed on its
        # fullest graph (the most levels: the most launches).
        smallest = min(self.capacities, key=lambda c: (c.tokens, -c.levels, -c.segments))
        plan = self._graphs[smallest].plan
        self.model(plan, self.state_pool, self.kv_pool, normed=True)
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        self.model(plan, self.state_pool, self.kv_pool, normed=True)
        torch.cuda.synchronize(self.device)
        self.launch_ms = 1e3 * (time.perf_counter() - t0)
        self.capture_seconds = time.perf_counter() - start
        logger.info("captured %d CUDA graphs in %.1f s", len(self._graphs), self.capture_seconds)
        return self.capture_seconds

    def _capture(self, capacity: GraphCapacity, into: Optional[dict] = None) -> _Graph:
        entry = _Graph(capacity)
        entry.buffers = RoundBuffers(self.device)
        # Any round that fits fixes the buffers' layout; its values do not matter.
        plan = plan_round([0], [[0] * min(capacity.tokens, 8)], "cpu")
        if self.state_pool is not None:
            plan.assign_slots([-1])
        if self.kv_pool is not None:
            plan.assign_kv_rows([], [self.kv_pool.scratch_row] * plan.num_tokens, self.kv_pool.scratch_row)
            self._write_keys(plan)
        device_plan = self._with_keys(device_round(plan, self.spec, self.device, capacity.tables, capacity.segments,
                                                   entry.buffers))
        entry.plan = device_plan
        if self._output is None:
            rows = max(c.segments for c in self.capacities + [capacity])
            hidden = self.model.lm_head.weight.shape[1]
            self._output = torch.empty(rows, hidden, dtype=self.dtype, device=self.device)
        # One capture stream for every graph: the allocator reuses a block only
        # on the stream that freed it, so graphs captured on one stream share
        # their pool's memory instead of each adding its own.
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            # Compiles and tunes kernels outside the capture.
            self.model(device_plan, self.state_pool, self.kv_pool, normed=True)
            torch.cuda.synchronize(self.device)
            entry.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(entry.graph, pool=self._pool, stream=stream):
                normed = self.model(device_plan, self.state_pool, self.kv_pool, normed=True)
                entry.output = self._output[: normed.shape[0]]
                entry.output.copy_(normed)
                del normed
        torch.cuda.current_stream(self.device).wait_stream(stream)
        entry.replay_ms = self._time_replay(entry.graph, REPLAY_TIMINGS if capacity.tokens <= TIMED_TOKENS else 1)
        if self._pool is None:
            self._pool = entry.graph.pool()
        (self._graphs if into is None else into)[capacity] = entry
        if into is None:
            self._faster = None  # a new flat graph may stand in for others
        self.captures += 1
        return entry

    def _time_replay(self, graph: torch.cuda.CUDAGraph, times: int) -> float:
        # The median of ``times`` replays' wall time (ms), each waited for.
        spans = []
        for _ in range(times):
            torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize(self.device)
            spans.append(1e3 * (time.perf_counter() - t0))
        return sorted(spans)[len(spans) // 2]

    def _pick(self, plan: FlatPlan) -> Optional[GraphCapacity]:
        size = (plan.num_tokens, int(plan.seg_start.numel()), plan.num_levels, int(plan.readout_rows.numel()))
        fits = next((c for c in self.capacities if c.holds(*size)), None)
        if fits is None:
            return None
        if self.mode == "per_shape":
            return GraphCapacity(size[0], max(size[1], size[3]), size[2])
        if self._faster is None:
            self._faster = faster_graphs({c: e.replay_ms for c, e in self._graphs.items()})
        fits = self._faster.get(fits, fits)
        entry = self._graphs.get(fits)
        if entry is not None and self._eager_ms(size[0]) < entry.replay_ms:
            self.eager_by_cost += 1
            return None
        return fits

    def _eager_ms(self, tokens: int) -> float:
        # A round run eagerly takes at least its launches' host time and at
        # least the GPU time of its own tokens, interpolated between the
        # replays of the capacities around it; a large round's launches hide
        # behind its GPU work, and it computes no padding.
        # The fastest graph per token count (a lean and a full graph share one):
        # the rows' own GPU time, with the least padding work.
        fastest: dict = {}
        for c, e in self._graphs.items():
            fastest[c.tokens] = min(e.replay_ms, fastest.get(c.tokens, e.replay_ms))
        timed = sorted(fastest.items())
        below = max((t for t in timed if t[0] <= tokens), default=timed[0])
        above = min((t for t in timed if t[0] >= tokens), default=timed[-1])
        gpu = below[1] if above[0] == below[0] else (
            below[1] + (tokens - below[0]) / (above[0] - below[0]) * (above[1] - below[1]))
        return max(self.launch_ms, gpu)

    def run(self, plan: FlatPlan, cancelled: Optional[Callable[[], bool]] = None
            ) -> tuple[torch.Tensor, Optional[GraphCapacity]]:
        """Run a round given as a host plan (slots assigned, and K/V rows when
        the runner has a K/V pool).

        Args:
            plan: the round's host plan.
            cancelled: asked before each layer of an eager round and once before
                a replay (None: never).

        Returns:
            ``([R', hidden] normed readout rows on the device in the LM head's
            dtype (:meth:`~flide_ext.models.base.FlatCausalLM.forward` with
            ``normed``; ``[R', vocab]`` float32 log-probabilities with selective
            readout off), whose first R rows are the plan's readout rows; the
            capacity replayed, or None when the round ran eagerly)``.

        Raises:
            ForwardCancelled: ``cancelled()`` was true.
        """
        if self._generation() != self._pool_generation:
            # The state pool grew: its tensors moved, so every graph is stale.
            # A round launched before may still be replaying one of them.
            torch.cuda.synchronize(self.device)
            self._graphs.clear()
            self._shaped.clear()
            self._pool_generation = self._generation()
            if self.mode == "flat":
                logger.warning("GDN state pool grew; recapturing CUDA graphs")
                self.capture()
        # The references read tables on the host: never inside a graph.
        # A round without K/V rows (the cache bypassed) cannot use graphs captured over the pool.
        unpooled = self._keys is not None and plan.kv_index is None
        # Without selective readout (the ablation) the LM head sees every row: no graph holds that.
        capacity = None if self.mode == "off" or self.model.kernel_backend == "reference" or unpooled \
            or self.eager or not self.model.selective_readout else self._pick(plan)
        if capacity is None:
            self.eager_rounds += 1
            self.last_host_ms = 0.0
            device_plan = device_round(plan, self.spec, self.device)
            self._mark(0)
            out = self.model(device_plan, self.state_pool, self.kv_pool, cancelled,
                             normed=self.model.selective_readout)
            self._mark(1)
            return out, None
        if cancelled is not None and cancelled():  # asked once: a replay cannot stop midway
            raise ForwardCancelled(0, len(self.model.model.layers))
        t0 = time.perf_counter()
        if self.mode == "per_shape":
            entry = self._shaped.get(capacity) or self._capture(capacity, self._shaped)
            self._shaped.move_to_end(capacity)
            while len(self._shaped) > PER_SHAPE_GRAPHS:
                torch.cuda.synchronize(self.device)  # a round launched before may be replaying it
                self._shaped.popitem(last=False)
        else:
            entry = self._graphs.get(capacity) or self._capture(capacity)
        device_round(plan, self.spec, self.device, capacity.tables, capacity.segments, entry.buffers, device_plan=False)
        if self._keys is not None:
            self._write_keys(plan)
        self.last_host_ms = 1e3 * (time.perf_counter() - t0)
        self._mark(0)
        entry.graph.replay()
        self._mark(1)
        self.replays += 1
        return entry.output, capacity

    def _mark(self, which: int) -> None:
        if self.device.type != "cuda":
            return
        if which == 0:  # a new pair per round: an earlier round still in flight keeps its own
            self._events = tuple(torch.cuda.Event(enable_timing=True) for _ in range(2))
        self._events[which].record()

    def last_marks(self) -> tuple:
        """``(host_ms, events)`` of the last round's forward: the host time of its
        tables and copy (0 when it ran eagerly) and the CUDA events around it on
        the GPU's stream (None before any round);
        :func:`~.launched_round.span_ms` reads them."""
        return self.last_host_ms, self._events
