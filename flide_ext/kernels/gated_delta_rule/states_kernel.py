"""The inter-chunk step of the chunked gated delta rule in Triton, the one
step that touches the recurrent state: each segment's state is read from its
initial slot and its final state written to its final slot (a child reads its
parent's slot by index, so forking copies nothing). Arguments and result as
:func:`flide_ext.kernels.gated_delta_rule.reference.chunk_states_ref`."""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..arguments import check_heads, check_written
from .chunks import CHUNK

# (BLOCK_V, num_warps, num_stages) of the inter-chunk kernel; chosen on the H200
# by benchmark/kernels/sweep_kernels.py (whole-tree pass, RACE / QuALITY /
# MultiRC: 99 / 97 / 103% of fla's time on the same tokens; the previous
# (32, 4, 3): 78 / 88 / 71%).
STATES_CONFIG = (64, 4, 2)


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
    num_chunks = tl.cdiv(eos - bos, BT)
    for c in range(num_chunks):
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
        # The state after the last chunk is wanted only when kept: a question
        # (a leaf, one chunk mostly) skips the update, half its matrix work.
        if (c + 1 < num_chunks) | (last >= 0):
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
    chunk_size: int = CHUNK,
    num_chunks: Optional[int] = None,
    h: Optional[torch.Tensor] = None,
    v_new: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Own Triton kernel for the inter-chunk step with forked states; arguments and
    result as :func:`flide_ext.kernels.gated_delta_rule.reference.chunk_states_ref`, plus
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
