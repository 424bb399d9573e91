"""Gated delta rule over varlen segments on the GPU, with forked initial states.

Same signature and result as :func:`flide_ext.kernels.gated_delta_rule.reference.chunk_gated_delta_rule_ref`.
The tree's levels run one after another; every kernel here reads a segment's
initial state from ``state_pool[initial_slot]`` and writes its final state to
``state_pool[final_slot]``, so forking a state to many questions copies nothing.

* :func:`gated_delta_rule_tree_triton`: a whole tree; the state-free steps of the
  chunked algorithm run once over all segments, the inter-chunk kernel level by
  level (what the models call).
* :func:`chunk_gated_delta_rule_forked`: one level of the chunked algorithm (Yang et al.,
  2024, arXiv:2406.06484) with fla-core's intra-chunk WY kernel and output
  kernel as they are, and this module's own inter-chunk kernel
  (:func:`chunk_states_triton`), the one step that touches the recurrent state.
* :func:`recurrent_gated_delta_rule_triton`: own token-by-token kernel; one
  program per segment, value head and ``BLOCK_V`` value columns.
* :func:`chunk_gated_delta_rule_fla`: fla-core's public chunked kernel with the
  parent states gathered (copied) into its dense initial-state tensor; kept as
  the measured alternative.

:func:`gated_delta_rule_forked` picks per level. Measured on the H200
(``benchmark/kernels/bench_gdn.py``, ``benchmark/results/kernels/``), for a
level of 32 questions forked from 4 states at Qwen3.5-4B shapes, GPU kernel
time: the recurrent kernel is fastest up to ~40 tokens per question (0.14 ms at
25 tokens against 0.23 chunked and 0.37 gathered), the chunked kernel with
forked states from ~64 tokens (0.31 ms against 0.32 recurrent at 64; 0.45
against 0.45 at 90; 0.99 against 1.25 at 256), and gathering states for fla's
public kernel costs a copy of ``HV*K*V`` floats per question on top of the same
work. Hence ``RECURRENT_MAX_LEN``.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..arguments import check_heads, check_written
from .chunks import CHUNK, ChunkSteps
from .fla_steps import fla_available, fla_steps
from .levels import TreeMeta, level_meta, pass_through, tree_meta
from .recurrent_kernel import recurrent_gated_delta_rule_triton
from .states_kernel import chunk_states_levels_triton, chunk_states_triton

# Longest segment (tokens) a level may hold and still run the recurrent kernel
# when its segments start from parent states, where levels run one by one
# (gated_delta_rule_forked); longer levels run the chunked path.
RECURRENT_MAX_LEN = 48


def chunk_gated_delta_rule_forked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state_pool: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    initial_slot: torch.Tensor,
    final_slot: torch.Tensor,
    use_qk_l2norm: bool = True,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Chunked gated delta rule over one tree level, states forked by index;
    arguments and result as
    :func:`flide_ext.kernels.gated_delta_rule.reference.chunk_gated_delta_rule_ref`.

    fla-core's intra-chunk WY kernel (``chunk_gated_delta_rule_fwd_intra``) and
    output kernel (``chunk_fwd_o``) run as they are; the inter-chunk step, the
    only one that touches the recurrent state, is this module's own
    :func:`chunk_states_triton`, which reads each segment's initial state from
    its slot and writes its final state to its slot (fla's takes a dense
    initial-state tensor, which would be one copy per question).

    Raises:
        ValueError: the level's segments do not lie back to back in stream order.
    """
    if out is None:
        out = v.new_zeros(v.shape)
    level = (seg_start, seg_len, initial_slot, final_slot)
    # One level is a one-level tree: the same pass the whole-tree path runs.
    meta = tree_meta([level])
    if meta is None:  # no rows: empty segments only pass their states on
        pass_through(level_meta(*level), state_pool)
        return out
    o = _chunk_pass(meta, chunk_steps() or fla_steps(), q, k, v, g, beta, scale, state_pool, use_qk_l2norm)
    out[meta.lo:meta.hi] = o.to(out.dtype)
    return out


def gated_delta_rule_forked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state_pool: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    initial_slot: torch.Tensor,
    final_slot: torch.Tensor,
    use_qk_l2norm: bool = True,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One tree level on the GPU; arguments and result as
    :func:`flide_ext.kernels.gated_delta_rule.reference.chunk_gated_delta_rule_ref`.

    Runs :func:`chunk_gated_delta_rule_forked` when fla-core is installed, except
    for levels of short forked segments (at most ``RECURRENT_MAX_LEN`` tokens),
    which run the own recurrent kernel; without fla, the recurrent kernel runs
    every level (see the module docstring)."""
    args = (q, k, v, g, beta, scale, state_pool, seg_start, seg_len, initial_slot, final_slot, use_qk_l2norm, out)
    if seg_start.numel() == 0:
        return out if out is not None else v.new_zeros(v.shape)
    meta = level_meta(seg_start, seg_len, initial_slot, final_slot)
    if fla_available() and not (meta.forked and meta.max_len <= RECURRENT_MAX_LEN):
        return chunk_gated_delta_rule_forked(*args)
    return recurrent_gated_delta_rule_triton(*args)


def chunk_steps() -> Optional[ChunkSteps]:
    """The state-free steps the tree path uses: fla-core's when it imports, else None."""
    return fla_steps() if fla_available() else None


def gated_delta_rule_tree_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state_pool: torch.Tensor,
    levels,
    use_qk_l2norm: bool = True,
    out: Optional[torch.Tensor] = None,
    tables=None,
    zero_padding: bool = True,
    table_steps: Optional[ChunkSteps] = None,
) -> torch.Tensor:
    """A whole prefix tree on the GPU; arguments and result as
    :func:`flide_ext.kernels.gated_delta_rule.reference.gated_delta_rule_tree_ref`.

    With ``tables`` (the round's :class:`~flide_ext.kernels.tables.KernelTables`)
    every step runs over all ``T`` rows with the tables' fixed-size chunk and
    level tables (``levels`` and ``out`` are not used), so the pass replays in
    a CUDA graph for any round the tables hold; rows past the round are zeros
    (``zero_padding``), or left as the steps wrote them (undefined).
    ``table_steps`` are the state-free steps the table pass runs with (fla-core's,
    or their references under the interpreter); without them the tables are not used.

    Only the inter-chunk step depends on a segment's initial state, so everything
    else runs once over the tree's segments as one varlen batch, exactly as
    fla-core runs independent sequences (:func:`chunk_steps`): the L2 norms, the
    gate's chunk cumsum, the intra-chunk WY kernel and the output kernel. The own
    inter-chunk kernel (:func:`chunk_states_triton`) then runs level by level,
    each level reading the slots the level before wrote, into the tree's
    chunk-state buffer. The work is fla's on the same tokens plus one inter-chunk
    launch per extra level.

    Every level runs chunked, short questions too: once the state-free steps are
    shared, a level's own cost is one inter-chunk launch, and running trailing
    levels of <= 48-token questions through the recurrent kernel instead measured
    slower on the H200 (MultiRC 91% against 103% of fla's time on the same
    tokens, QuALITY 81-87% against 97-102%; ``benchmark/kernels/sweep_kernels.py
    --only states``, ``benchmark/results/kernels/``). Without fla-core, or when
    rows lie between segments, the levels run one by one through
    :func:`gated_delta_rule_forked`.

    Raises:
        ValueError: HV is not a multiple of H; ``state_pool`` not contiguous; a
            level's non-empty segments do not lie back to back in stream order.
    """
    T, HV, _ = v.shape
    check_heads(k.shape[1], HV)
    check_written(state_pool=state_pool)
    steps = table_steps if tables is not None else None
    if steps is not None:
        return _table_pass(tables, steps, q, k, v, g, beta, scale, state_pool, use_qk_l2norm, zero_padding)
    levels = list(levels)
    steps = chunk_steps() if levels else None
    meta = tree_meta(levels) if steps is not None else None
    if meta is None:
        # The level kernels write rows in place: into a contiguous buffer, copied
        # back when the caller's ``out`` is strided.
        work = v.new_zeros(v.shape) if out is None else out if out.is_contiguous() else out.contiguous()
        for level in levels:
            gated_delta_rule_forked(q, k, v, g, beta, scale, state_pool, *level, use_qk_l2norm, work)
        if out is not None and work is not out:
            out.copy_(work)
        return work if out is None else out
    o = _chunk_pass(meta, steps, q, k, v, g, beta, scale, state_pool, use_qk_l2norm)
    if out is None and meta.lo == 0 and meta.hi == T and o.dtype == v.dtype:
        return o  # every row is a segment row: no copy into a zeroed tensor
    if out is None:
        out = v.new_zeros(v.shape)
    out[meta.lo:meta.hi] = o.to(out.dtype)
    return out


def _chunked(steps: ChunkSteps, q, k, v, g, beta, scale, cu, ci, num_chunks: int, use_qk_l2norm, inter_chunk):
    # The chunked algorithm's state-free steps once over the rows given, with
    # ``inter_chunk(k, w, u, g_cum, h, v_new)`` filling the chunk states and the
    # corrected values in between.
    if use_qk_l2norm:
        q, k = steps.l2norm(q), steps.l2norm(k)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g_cum = steps.local_cumsum(g, cu, ci)
    w, u = steps.wy(k, v, g_cum, beta, cu, ci)
    h = torch.empty(num_chunks, v.shape[1], k.shape[2], v.shape[2], dtype=k.dtype, device=v.device)
    v_new = u.new_empty(u.shape)
    inter_chunk(k, w.contiguous(), u.contiguous(), g_cum.contiguous(), h, v_new)
    return steps.output(q, k, v_new, h, g_cum, scale, cu, ci)


def _chunk_pass(meta: TreeMeta, steps: ChunkSteps, q, k, v, g, beta, scale, state_pool, use_qk_l2norm):
    # The tree's rows [lo, hi), the inter-chunk kernel per level. Returns the
    # outputs of those rows.
    lo, hi = meta.lo, meta.hi

    def levels(k, w, u, g_cum, h, v_new):
        for level, c0 in meta.levels:
            pass_through(level, state_pool)
            if level.hi == level.lo:
                continue
            a, b = level.lo - lo, level.hi - lo
            chunk_states_triton(k[a:b], w[a:b], u[a:b], g_cum[a:b], state_pool, level.cu_seqlens,
                                level.chunk_offsets, level.initial, level.final, CHUNK, level.num_chunks,
                                h=h[c0:c0 + level.num_chunks], v_new=v_new[a:b])

    return _chunked(steps, q[lo:hi], k[lo:hi], v[lo:hi], g[lo:hi], beta[lo:hi], scale, meta.cu_seqlens,
                    meta.chunk_indices, meta.num_chunks, use_qk_l2norm, levels)


def _table_pass(tables, steps: ChunkSteps, q, k, v, g, beta, scale, state_pool, use_qk_l2norm, zero_padding):
    # Every row with the round's fixed-size tables: padding rows belong to no
    # sequence, and their outputs are set to zero (``zero_padding``) or left.
    def levels(k, w, u, g_cum, h, v_new):
        chunk_states_levels_triton(k, w, u, g_cum, state_pool, h, v_new, tables)

    o = _chunked(steps, q, k, v, g, beta, scale, tables.cu_seqlens, tables.chunk_indices,
                 tables.chunk_indices.shape[0], use_qk_l2norm, levels)
    if zero_padding:
        o = torch.where(tables.row_valid[:, None, None], o, 0)
    return o.to(v.dtype)
