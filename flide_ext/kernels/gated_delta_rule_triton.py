"""Gated delta rule over varlen segments on the GPU, with forked initial states.

Same signature and result as :func:`flide_ext.kernels.gated_delta_rule.chunk_gated_delta_rule_ref`.
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

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from .arguments import check_written
from .gated_delta_rule import check_heads
from .round_cache import round_cache
from .tables import CHUNK

# Longest segment (tokens) a level may hold and still run the recurrent kernel
# when its segments start from parent states, where levels run one by one
# (gated_delta_rule_forked); longer levels run the chunked path.
RECURRENT_MAX_LEN = 48
# (BLOCK_V, num_warps) of the recurrent kernel; chosen on the H200 by
# benchmark/kernels/sweep_kernels.py.
RECURRENT_CONFIG = (32, 1)
# (BLOCK_V, num_warps, num_stages) of the inter-chunk kernel; chosen on the H200
# by benchmark/kernels/sweep_kernels.py (whole-tree pass, RACE / QuALITY /
# MultiRC: 99 / 97 / 103% of fla's time on the same tokens; the previous
# (32, 4, 3): 78 / 88 / 71%).
STATES_CONFIG = (64, 4, 2)


@triton.jit
def _recurrent_kernel(
    Q, K, V, G, BETA, O, POOL,
    SEG_START, SEG_LEN, INITIAL, FINAL,
    scale, stride_qt, stride_kt, stride_vt, stride_ot,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, L2NORM: tl.constexpr,
):
    seg = tl.program_id(0)
    hv = tl.program_id(1)
    h = hv // (HV // H)
    kk = tl.arange(0, BLOCK_K)
    vv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok = kk < DK
    v_ok = vv < DV
    start = tl.load(SEG_START + seg)
    n = tl.load(SEG_LEN + seg)
    first = tl.load(INITIAL + seg)
    last = tl.load(FINAL + seg)
    state_off = hv * DK * DV + kk[:, None] * DV + vv[None, :]
    state_mask = k_ok[:, None] & v_ok[None, :]
    S = tl.load(POOL + first.to(tl.int64) * HV * DK * DV + state_off, mask=state_mask & (first >= 0),
                other=0.0).to(tl.float32)
    # Each step's inputs are loaded one step ahead, so their memory latency
    # overlaps the previous step's arithmetic.
    t = start.to(tl.int64)
    has = n > 0
    q_next = tl.load(Q + t * stride_qt + h * DK + kk, mask=k_ok & has, other=0.0)
    k_next = tl.load(K + t * stride_kt + h * DK + kk, mask=k_ok & has, other=0.0)
    v_next = tl.load(V + t * stride_vt + hv * DV + vv, mask=v_ok & has, other=0.0)
    g_next = tl.load(G + t * HV + hv, mask=has, other=0.0)
    b_next = tl.load(BETA + t * HV + hv, mask=has, other=0.0)
    for i in range(n):
        t = (start + i).to(tl.int64)
        q = q_next.to(tl.float32)
        k = k_next.to(tl.float32)
        v = v_next.to(tl.float32)
        g = g_next.to(tl.float32)
        b = b_next.to(tl.float32)
        more = i + 1 < n
        q_next = tl.load(Q + (t + 1) * stride_qt + h * DK + kk, mask=k_ok & more, other=0.0)
        k_next = tl.load(K + (t + 1) * stride_kt + h * DK + kk, mask=k_ok & more, other=0.0)
        v_next = tl.load(V + (t + 1) * stride_vt + hv * DV + vv, mask=v_ok & more, other=0.0)
        g_next = tl.load(G + (t + 1) * HV + hv, mask=more, other=0.0)
        b_next = tl.load(BETA + (t + 1) * HV + hv, mask=more, other=0.0)
        if L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q) + 1e-6)
            k = k * tl.rsqrt(tl.sum(k * k) + 1e-6)
        S = S * tl.exp(g)
        delta = b * (v - tl.sum(S * k[:, None], axis=0))
        S = S + k[:, None] * delta[None, :]
        o = tl.sum(S * (q * scale)[:, None], axis=0)
        tl.store(O + t * stride_ot + hv * DV + vv, o.to(O.dtype.element_ty), mask=v_ok)
    if last >= 0:
        tl.store(POOL + last.to(tl.int64) * HV * DK * DV + state_off, S.to(POOL.dtype.element_ty), mask=state_mask)


@triton.jit
def _chunk_states_kernel(
    K, W, U, G, H_OUT, V_NEW, POOL, CU, CHUNK_OFFSET, INITIAL, FINAL, RANGE, seq_lo, seq_hi, level,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BT: tl.constexpr, HALF_K: tl.constexpr, BLOCK_V: tl.constexpr, IEEE: tl.constexpr,
    RANGE_IN_MEMORY: tl.constexpr,
):
    # Sequences [seq_lo, seq_hi) (or the range RANGE holds for ``level``, so a
    # CUDA graph replays the launch for any round) are spread over the grid's
    # second axis, each program taking every num_programs(1)-th.
    if RANGE_IN_MEMORY:
        seq_lo = tl.load(RANGE + 2 * level)
        seq_hi = tl.load(RANGE + 2 * level + 1)
    for n in range(seq_lo + tl.program_id(1), seq_hi, tl.num_programs(1)):
        _chunk_states_one(K, W, U, G, H_OUT, V_NEW, POOL, CU, CHUNK_OFFSET, INITIAL, FINAL, n,
                          H, HV, DK, DV, BT, HALF_K, BLOCK_V, IEEE)


@triton.jit
def _chunk_states_one(
    K, W, U, G, H_OUT, V_NEW, POOL, CU, CHUNK_OFFSET, INITIAL, FINAL, n,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BT: tl.constexpr, HALF_K: tl.constexpr, BLOCK_V: tl.constexpr, IEEE: tl.constexpr,
):
    # The state's K rows are held as two register tiles of HALF_K rows (smaller
    # matrix operands, fewer registers per tile).
    vv = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    hv = tl.program_id(2)
    h = hv // (HV // H)
    k1 = tl.arange(0, HALF_K)
    k2 = HALF_K + tl.arange(0, HALF_K)
    ok1, ok2 = k1 < DK, k2 < DK
    v_ok = vv < DV
    bos = tl.load(CU + n)
    eos = tl.load(CU + n + 1)
    c0 = tl.load(CHUNK_OFFSET + n)
    first = tl.load(INITIAL + n)
    last = tl.load(FINAL + n)
    off1 = hv * DK * DV + k1[:, None] * DV + vv[None, :]
    off2 = hv * DK * DV + k2[:, None] * DV + vv[None, :]
    mask1 = ok1[:, None] & v_ok[None, :]
    mask2 = ok2[:, None] & v_ok[None, :]
    # The parent's state is read from its slot: no copy per forked sequence.
    src = POOL + first.to(tl.int64) * HV * DK * DV
    S1 = tl.load(src + off1, mask=mask1 & (first >= 0), other=0.0).to(tl.float32)
    S2 = tl.load(src + off2, mask=mask2 & (first >= 0), other=0.0).to(tl.float32)
    for c in range(tl.cdiv(eos - bos, BT)):
        t0 = bos + c * BT
        rows = t0 + tl.arange(0, BT)
        r_ok = rows < eos
        r64 = rows.to(tl.int64)
        dst = H_OUT + (c0 + c).to(tl.int64) * HV * DK * DV
        tl.store(dst + off1, S1.to(H_OUT.dtype.element_ty), mask=mask1)
        tl.store(dst + off2, S2.to(H_OUT.dtype.element_ty), mask=mask2)
        w_rows = W + r64[:, None] * HV * DK + hv * DK
        w1 = tl.load(w_rows + k1[None, :], mask=r_ok[:, None] & ok1[None, :], other=0.0)
        w2 = tl.load(w_rows + k2[None, :], mask=r_ok[:, None] & ok2[None, :], other=0.0)
        u = tl.load(U + r64[:, None] * HV * DV + hv * DV + vv[None, :], mask=r_ok[:, None] & v_ok[None, :], other=0.0)
        if IEEE:
            wS = tl.dot(w1, S1.to(w1.dtype), input_precision="ieee")
            wS = tl.dot(w2, S2.to(w2.dtype), wS, input_precision="ieee")
        else:
            wS = tl.dot(w1, S1.to(w1.dtype))
            wS = tl.dot(w2, S2.to(w2.dtype), wS)
        v_new = u.to(tl.float32) - wS
        tl.store(V_NEW + r64[:, None] * HV * DV + hv * DV + vv[None, :], v_new.to(V_NEW.dtype.element_ty),
                 mask=r_ok[:, None] & v_ok[None, :])
        g = tl.load(G + r64 * HV + hv, mask=r_ok, other=0.0)
        g_last = tl.load(G + (tl.minimum(t0 + BT, eos) - 1).to(tl.int64) * HV + hv)
        scaled = tl.where(r_ok[:, None], v_new * tl.exp2(g_last - g)[:, None], 0.0)
        k_rows = K + r64[:, None] * H * DK + h * DK
        ka = tl.load(k_rows + k1[None, :], mask=r_ok[:, None] & ok1[None, :], other=0.0)
        kb = tl.load(k_rows + k2[None, :], mask=r_ok[:, None] & ok2[None, :], other=0.0)
        decay = tl.exp2(g_last)
        if IEEE:
            S1 = S1 * decay + tl.dot(tl.trans(ka), scaled.to(ka.dtype), input_precision="ieee")
            S2 = S2 * decay + tl.dot(tl.trans(kb), scaled.to(kb.dtype), input_precision="ieee")
        else:
            S1 = S1 * decay + tl.dot(tl.trans(ka), scaled.to(ka.dtype))
            S2 = S2 * decay + tl.dot(tl.trans(kb), scaled.to(kb.dtype))
    if last >= 0:
        dst = POOL + last.to(tl.int64) * HV * DK * DV
        tl.store(dst + off1, S1.to(POOL.dtype.element_ty), mask=mask1)
        tl.store(dst + off2, S2.to(POOL.dtype.element_ty), mask=mask2)


def chunk_states_triton(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    g_cum: torch.Tensor,
    state_pool: torch.Tensor,
    cu_seqlens: torch.Tensor,
    chunk_offsets: torch.Tensor,
    initial_slot: torch.Tensor,
    final_slot: torch.Tensor,
    chunk_size: int = 64,
    num_chunks: Optional[int] = None,
    h: Optional[torch.Tensor] = None,
    v_new: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Own Triton kernel for the inter-chunk step with forked states; arguments and
    result as :func:`flide_ext.kernels.gated_delta_rule.chunk_states_ref`, plus
    ``num_chunks`` (``chunk_offsets[-1]``, to skip a device sync when known) and
    optional contiguous outputs ``h`` ``[NT, HV, K, V]`` and ``v_new``
    ``[T, HV, V]`` to write into (views of a whole tree's buffers).
    One program runs one sequence, one value head and ``BLOCK_V`` value columns;
    inputs are made contiguous ``[T, heads, dim]``.

    Raises:
        ValueError: HV not a multiple of H; ``chunk_size`` not a power of two of at
            least 16; ``state_pool``, ``h`` or ``v_new`` not contiguous.
    """
    T, HV, DV = u.shape
    H, DK = k.shape[1], k.shape[2]
    check_heads(H, HV)
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two of at least 16, not {chunk_size}")
    NT = int(chunk_offsets[-1]) if num_chunks is None else num_chunks
    if h is None:
        h = torch.empty(NT, HV, DK, DV, dtype=k.dtype, device=k.device)
    if v_new is None:
        v_new = u.new_empty(u.shape)
    check_written(state_pool=state_pool, h=h, v_new=v_new)
    N = initial_slot.numel()
    if N == 0:
        return h, v_new
    BLOCK_V, warps, stages = STATES_CONFIG
    BLOCK_V = min(BLOCK_V, triton.next_power_of_2(DV))
    _chunk_states_kernel[(triton.cdiv(DV, BLOCK_V), N, HV)](
        k.contiguous(), w.contiguous(), u.contiguous(), g_cum.contiguous(), h, v_new, state_pool,
        cu_seqlens, chunk_offsets, initial_slot, final_slot, initial_slot, 0, N, 0,
        H=H, HV=HV, DK=DK, DV=DV, BT=chunk_size, HALF_K=max(16, triton.next_power_of_2(DK) // 2), BLOCK_V=BLOCK_V,
        IEEE=k.dtype == torch.float32, RANGE_IN_MEMORY=False, num_warps=warps, num_stages=stages,
    )
    return h, v_new


def chunk_states_levels_triton(k, w, u, g_cum, state_pool, h, v_new, tables) -> None:
    """The inter-chunk step of a whole tree from its :class:`~flide_ext.kernels.tables.KernelTables`:
    one launch per table level (padding levels are empty), each running the
    level's segments (a range of the segment table, read on the device) over
    ``tables.level_programs`` programs per value head. Rows, chunks and slots are
    the tables' (absolute over the stream); writes ``h`` ``[NT, HV, K, V]``,
    ``v_new`` ``[T, HV, V]`` and the kept final states in ``state_pool``.
    """
    T, HV, DV = u.shape
    H, DK = k.shape[1], k.shape[2]
    BLOCK_V, warps, stages = STATES_CONFIG
    BLOCK_V = min(BLOCK_V, triton.next_power_of_2(DV))
    t = tables
    for level in range(t.num_levels):
        _chunk_states_kernel[(triton.cdiv(DV, BLOCK_V), t.level_programs, HV)](
            k, w, u, g_cum, h, v_new, state_pool, t.cu_seqlens, t.chunk_offsets, t.initial_slot, t.final_slot,
            t.level_range, 0, 0, level,
            H=H, HV=HV, DK=DK, DV=DV, BT=CHUNK, HALF_K=max(16, triton.next_power_of_2(DK) // 2), BLOCK_V=BLOCK_V,
            IEEE=k.dtype == torch.float32, RANGE_IN_MEMORY=True, num_warps=warps, num_stages=stages,
        )


def _rows(x: torch.Tensor) -> torch.Tensor:
    # Kernels index heads and features densely within a row.
    return x if x.numel() == 0 or x[0].is_contiguous() else x.contiguous()


def recurrent_gated_delta_rule_triton(
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
    """Own Triton kernel, token by token, state in float32 registers; arguments and
    result as :func:`flide_ext.kernels.gated_delta_rule.recurrent_gated_delta_rule_ref`.
    A segment's initial and final slots must differ.

    Raises:
        ValueError: HV not a multiple of H; ``out`` or ``state_pool`` not contiguous.
    """
    T, HV, DV = v.shape
    H, DK = k.shape[1], k.shape[2]
    check_heads(H, HV)
    if out is None:
        out = v.new_zeros(v.shape)
    check_written(out=out, state_pool=state_pool)
    S = seg_start.numel()
    if S == 0:
        return out
    q, k, v = _rows(q), _rows(k), _rows(v)
    BLOCK_V, warps = RECURRENT_CONFIG
    BLOCK_V = min(BLOCK_V, triton.next_power_of_2(DV))
    _recurrent_kernel[(S, HV, triton.cdiv(DV, BLOCK_V))](
        q, k, v, g.contiguous(), beta.contiguous(), out, state_pool,
        seg_start.int(), seg_len.int(), initial_slot.int(), final_slot.int(),
        scale, q.stride(0), k.stride(0), v.stride(0), out.stride(0),
        H=H, HV=HV, DK=DK, DV=DV, BLOCK_K=triton.next_power_of_2(DK), BLOCK_V=BLOCK_V,
        L2NORM=use_qk_l2norm, num_warps=warps,
    )
    return out


@functools.lru_cache(maxsize=None)
def fla_available() -> bool:
    """True when fla-core's chunked gated delta rule imports (GPU machines only:
    on a CPU-only machine importing fla makes transformers pick it and fail).
    Asked once per process: every GDN layer's dispatch consults it."""
    from .fla_configs import use_shipped

    use_shipped()
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception:
        return False
    return True


@dataclass
class LevelMeta:
    """Host-side facts and varlen tables of one tree level (built once per round)."""

    lo: int  # first stream row of the level's (non-empty) segments
    hi: int  # one past the last row
    max_len: int
    forked: bool  # some segment starts from a parent state
    cu_seqlens: torch.Tensor  # [n+1] int64, relative to lo, non-empty segments only
    chunk_indices: Optional[torch.Tensor]  # fla's (sequence, chunk) table, [NT, 2]
    chunk_offsets: torch.Tensor  # [n+1] first chunk of each sequence
    num_chunks: int
    initial: torch.Tensor  # [n] int32 slots of the non-empty segments
    final: torch.Tensor
    through: Optional[tuple[torch.Tensor, torch.Tensor]]  # empty segments: (from, to) slots


def _level_meta(seg_start, seg_len, initial_slot, final_slot, chunk_size: int = 64) -> LevelMeta:
    lens = seg_len.tolist()
    starts = seg_start.tolist()
    initial = initial_slot.tolist()
    keep = [i for i, n in enumerate(lens) if n > 0]
    empty = [i for i, n in enumerate(lens) if n == 0]
    device = seg_start.device
    through = None
    if empty:
        idx = torch.tensor(empty, device=device)
        src, dst = initial_slot[idx], final_slot[idx]
        keep_dst = dst >= 0
        through = (src[keep_dst], dst[keep_dst])
    if not keep:
        z = torch.zeros(1, dtype=torch.long, device=device)
        return LevelMeta(0, 0, 0, False, z, None, z, 0, z[:0].int(), z[:0].int(), through)
    lo = starts[keep[0]]
    bounds, pos = [0], lo
    for i in keep:
        if starts[i] != pos:
            raise ValueError("a tree level's segments must lie back to back in stream order")
        pos += lens[i]
        bounds.append(pos - lo)
    chunks = [0]
    for i in keep:
        chunks.append(chunks[-1] + -(-lens[i] // chunk_size))
    idx = torch.tensor(keep, device=device)
    pairs = [(n, c) for n, i in enumerate(keep) for c in range(-(-lens[i] // chunk_size))]
    return LevelMeta(
        lo=lo, hi=pos, max_len=max(lens[i] for i in keep),
        forked=any(initial[i] >= 0 for i in keep),
        cu_seqlens=torch.tensor(bounds, dtype=torch.long, device=device),
        chunk_indices=torch.tensor(pairs, dtype=torch.long, device=device),
        chunk_offsets=torch.tensor(chunks, dtype=torch.long, device=device),
        num_chunks=chunks[-1],
        initial=initial_slot[idx].int(), final=final_slot[idx].int(), through=through,
    )


def level_meta(seg_start, seg_len, initial_slot, final_slot) -> LevelMeta:
    """:class:`LevelMeta` of a level, memoised for the round (:mod:`.round_cache`).

    Raises:
        ValueError: the non-empty segments do not lie back to back in stream order.
    """
    tensors = (seg_start, seg_len, initial_slot, final_slot)
    return round_cache.get("gdn_level", tensors, lambda: _level_meta(*tensors))


def _pass_through(meta: LevelMeta, state_pool: torch.Tensor) -> None:
    # An empty segment's state is its initial state.
    if meta.through is not None and meta.through[0].numel():
        src, dst = meta.through
        state = torch.where((src >= 0)[:, None, None, None], state_pool[src.clamp(min=0)], 0)
        state_pool[dst] = state.to(state_pool.dtype)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    # fla-core's fused row L2 norm (eps 1e-6, as the reference): one kernel
    # where the same in PyTorch ops took five.
    from fla.modules.norm.l2norm import l2norm_fwd

    return l2norm_fwd(x.contiguous())[0]


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
    :func:`flide_ext.kernels.gated_delta_rule.chunk_gated_delta_rule_ref`.

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
        _pass_through(level_meta(*level), state_pool)
        return out
    o = _chunk_pass(meta, chunk_steps() or fla_steps(), q, k, v, g, beta, scale, state_pool, use_qk_l2norm)
    out[meta.lo:meta.hi] = o.to(out.dtype)
    return out


def chunk_gated_delta_rule_fla(
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
    """fla-core's public chunked kernel over one tree level, initial states
    gathered (copied) from their slots and final states scattered back: the
    alternative :func:`chunk_gated_delta_rule_forked` is measured against.
    Arguments and result as :func:`flide_ext.kernels.gated_delta_rule.chunk_gated_delta_rule_ref`.

    Raises:
        ValueError: the level's segments do not lie back to back in stream order.
    """
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

    if out is None:
        out = v.new_zeros(v.shape)
    meta = level_meta(seg_start, seg_len, initial_slot, final_slot)
    _pass_through(meta, state_pool)
    if meta.hi == meta.lo:
        return out
    lo, hi = meta.lo, meta.hi
    initial = None
    if meta.forked:
        first = meta.initial.long()
        initial = torch.where((first >= 0)[:, None, None, None], state_pool[first.clamp(min=0)], 0).float()
    o, final = fla_chunk(
        q[None, lo:hi], k[None, lo:hi], v[None, lo:hi], g[None, lo:hi].float(), beta[None, lo:hi],
        scale=scale, initial_state=initial, output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices,
    )
    out[lo:hi] = o[0].to(out.dtype)
    last = meta.final.long()
    kept = last >= 0
    state_pool[last[kept]] = final[kept].to(state_pool.dtype)
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
    :func:`flide_ext.kernels.gated_delta_rule.chunk_gated_delta_rule_ref`.

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


@dataclass
class TreeMeta:
    """Host-side facts and varlen tables of a whole tree (built once per round):
    every non-empty segment of every level, in stream order, as one varlen batch."""

    lo: int  # first stream row of the tree's segments
    hi: int  # one past the last row
    cu_seqlens: torch.Tensor  # [n+1] int64, relative to lo
    chunk_indices: torch.Tensor  # fla's (sequence, chunk) table, [NT, 2]
    num_chunks: int
    levels: list  # per level: (LevelMeta, first chunk of the level in the tree's numbering)


def _tree_meta(levels) -> Optional[TreeMeta]:
    metas = [level_meta(*level) for level in levels]
    spans = sorted((start, n) for level in levels for start, n in zip(level[0].tolist(), level[1].tolist()) if n > 0)
    if not spans:
        return None
    bounds, chunks, first_chunk = [0], [0], {}
    lo = pos = spans[0][0]
    for start, n in spans:
        if start != pos:
            return None  # rows between segments: the levels run one by one instead
        first_chunk[start] = chunks[-1]
        pos += n
        bounds.append(pos - lo)
        chunks.append(chunks[-1] + -(-n // 64))
    device = levels[0][0].device
    pairs = [(i, c) for i, (_, n) in enumerate(spans) for c in range(-(-n // 64))]
    return TreeMeta(
        lo=lo, hi=pos,
        cu_seqlens=torch.tensor(bounds, dtype=torch.long, device=device),
        chunk_indices=torch.tensor(pairs, dtype=torch.long, device=device),
        num_chunks=chunks[-1],
        levels=[(m, first_chunk.get(m.lo, 0)) for m in metas],
    )


def tree_meta(levels) -> Optional[TreeMeta]:
    """:class:`TreeMeta` of a tree's level tables, memoised for the round
    (:mod:`.round_cache`); None when the segments leave rows between them.

    Raises:
        ValueError: a level's non-empty segments do not lie back to back in stream order.
    """
    tensors = tuple(t for level in levels for t in level)
    return round_cache.get("gdn_tree", tensors, lambda: _tree_meta(levels))


@dataclass(frozen=True)
class ChunkSteps:
    """The state-free steps of the chunked algorithm, 2-D (no batch dimension),
    with the signatures of their references in :mod:`.gated_delta_rule`
    (``chunk_local_cumsum_ref``, ``chunk_wy_ref``, ``chunk_output_ref``) plus
    fla's ``chunk_indices`` table as the last argument."""

    l2norm: Callable  # [T, H, K] -> [T, H, K], rows scaled to unit norm (eps 1e-6)
    local_cumsum: Callable  # (g, cu_seqlens, chunk_indices) -> g_cum
    wy: Callable  # (k, v, g_cum, beta, cu_seqlens, chunk_indices) -> (w, u)
    output: Callable  # (q, k, v_new, h, g_cum, scale, cu_seqlens, chunk_indices) -> o


@functools.lru_cache(maxsize=None)
def fla_steps() -> ChunkSteps:
    """fla-core's kernels for the state-free steps (64-row chunks)."""
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    def local_cumsum(g, cu, ci):
        return chunk_local_cumsum(g[None].float(), chunk_size=64, scale=RCP_LN2, cu_seqlens=cu, chunk_indices=ci)[0]

    def wy(k, v, g_cum, beta, cu, ci):
        w, u, _ = chunk_gated_delta_rule_fwd_intra(k=k[None], v=v[None], g=g_cum[None], beta=beta[None].contiguous(),
                                                   cu_seqlens=cu, chunk_size=64, chunk_indices=ci)
        return w[0], u[0]

    def output(q, k, v_new, h, g_cum, scale, cu, ci):
        return chunk_fwd_o(q=q[None], k=k[None], v=v_new[None], h=h[None], g=g_cum[None], scale=scale,
                           cu_seqlens=cu, chunk_size=64, chunk_indices=ci)[0]

    return ChunkSteps(l2norm=_l2norm, local_cumsum=local_cumsum, wy=wy, output=output)


def reference_steps() -> ChunkSteps:
    """The PyTorch references of the state-free steps (float64 inside); lets the
    tree's composition run on CPU with the interpreted inter-chunk kernel."""
    from .gated_delta_rule import chunk_local_cumsum_ref, chunk_output_ref, chunk_wy_ref

    def l2norm(x):
        xf = x.double()
        return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + 1e-6)).to(x.dtype)

    return ChunkSteps(
        l2norm=l2norm,
        local_cumsum=lambda g, cu, ci: chunk_local_cumsum_ref(g, cu),
        wy=lambda k, v, g_cum, beta, cu, ci: chunk_wy_ref(k, v, g_cum, beta, cu),
        output=lambda q, k, v_new, h, g_cum, scale, cu, ci: chunk_output_ref(q, k, v_new, h, g_cum, scale, cu),
    )


def table_steps(x: torch.Tensor) -> Optional[ChunkSteps]:
    """The state-free steps the table-driven pass runs with: fla-core's; under the
    Triton interpreter (CPU tensors) their references; None on a GPU without
    fla-core (the levels then run one by one, from the level tables)."""
    return chunk_steps() or (None if x.is_cuda else reference_steps())


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
) -> torch.Tensor:
    """A whole prefix tree on the GPU; arguments and result as
    :func:`flide_ext.kernels.gated_delta_rule.gated_delta_rule_tree_ref`.

    With ``tables`` (the round's :class:`~flide_ext.kernels.tables.KernelTables`)
    every step runs over all ``T`` rows with the tables' fixed-size chunk and
    level tables (``levels`` and ``out`` are not used), so the pass replays in
    a CUDA graph for any round the tables hold; rows past the round are zeros.
    On a GPU without fla-core the tables are not used (:func:`table_steps`).

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
    steps = table_steps(v) if tables is not None else None
    if steps is not None:
        return _table_pass(tables, steps, q, k, v, g, beta, scale, state_pool, use_qk_l2norm)
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
            _pass_through(level, state_pool)
            if level.hi == level.lo:
                continue
            a, b = level.lo - lo, level.hi - lo
            chunk_states_triton(k[a:b], w[a:b], u[a:b], g_cum[a:b], state_pool, level.cu_seqlens,
                                level.chunk_offsets, level.initial, level.final, 64, level.num_chunks,
                                h=h[c0:c0 + level.num_chunks], v_new=v_new[a:b])

    return _chunked(steps, q[lo:hi], k[lo:hi], v[lo:hi], g[lo:hi], beta[lo:hi], scale, meta.cu_seqlens,
                    meta.chunk_indices, meta.num_chunks, use_qk_l2norm, levels)


def _table_pass(tables, steps: ChunkSteps, q, k, v, g, beta, scale, state_pool, use_qk_l2norm):
    # Every row with the round's fixed-size tables: padding rows belong to no
    # sequence, and their outputs are set to zero.
    def levels(k, w, u, g_cum, h, v_new):
        chunk_states_levels_triton(k, w, u, g_cum, state_pool, h, v_new, tables)

    o = _chunked(steps, q, k, v, g, beta, scale, tables.cu_seqlens, tables.chunk_indices,
                 tables.chunk_indices.shape[0], use_qk_l2norm, levels)
    return torch.where(tables.row_valid[:, None, None], o, 0).to(v.dtype)
