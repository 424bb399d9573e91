"""Short leaf segments of the gated delta rule, each solved as one chunk in one
Triton program: arguments and result as
:func:`flide_ext.kernels.gated_delta_rule.reference.gated_delta_rule_leaves_ref`.

A question is mostly a leaf of the prefix tree a few dozen tokens long. In the
chunked pass it is padded to a ``CHUNK``-row chunk by every state-free step, and
its WY factors, corrected values and entering state cross memory between four
kernels. Here a leaf of at most ``LEAF_ROWS`` rows is one chunk held in
registers: the chunk's unit-lower-triangular system ``T = (I + A)^-1`` with
``A[i, j] = beta_i k_i.k_j 2**(g_i - g_j)`` (``j < i``) inverted by blocks
(forward substitution within the diagonal blocks), ``w = T (beta 2**g k)``, ``u = T (beta v)``, the corrected values
``u - w S`` against the parent's state ``S`` read from its slot, and the output
``scale * (2**g (q S) + ((q k^T) * D) (u - w S))`` (the UT form of the delta
rule: Yang et al., 2024, arXiv:2406.06484). A leaf's final state is not kept.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..arguments import check_heads
from .chunks import LEAF_PROGRAMS, LEAF_ROWS

# (BLOCK_V, num_warps, num_stages) of the leaf kernel: the widest value block
# whose state block, keys and WY factors fit eight warps' registers without
# spilling when compiled for sm_90 (ptxas -v); to be swept on the GPU
# (benchmark/kernels/sweep_kernels.py --only leaves).
LEAF_CONFIG = (64, 8, 1)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _exact_dot(a, b):
    # The chunk's system in float32 products (TF32 would round it away); float64 as it is.
    if a.dtype == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _gdn_leaves_kernel(
    Q, K, V, G, BETA, O, POOL, SEG_START, SEG_LEN, INITIAL, LEAVES, num_leaves, scale,
    H: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BLOCK_V: tl.constexpr, IEEE: tl.constexpr,
):
    vv = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    hv = tl.program_id(2)
    h = hv // (HV // H)
    kk = tl.arange(0, BK)
    k_ok, v_ok = kk < DK, vv < DV
    idx = tl.arange(0, BT)
    lower = idx[:, None] > idx[None, :]
    causal = idx[:, None] >= idx[None, :]
    HALF: tl.constexpr = BT // 2
    diagonal = (idx[:, None] // HALF) == (idx[None, :] // HALF)
    for i in range(tl.program_id(1), num_leaves, tl.num_programs(1)):
        n = tl.load(LEAVES + i)
        length = tl.load(SEG_LEN + n)
        if length > 0:  # the padding segment has no rows
            r64 = (tl.load(SEG_START + n) + idx).to(tl.int64)
            r_ok = idx < length
            qk_mask = r_ok[:, None] & k_ok[None, :]
            b_k = tl.load(K + r64[:, None] * H * DK + h * DK + kk[None, :], mask=qk_mask, other=0.0)
            b_g = tl.load(G + r64 * HV + hv, mask=r_ok, other=0.0).to(tl.float32)
            b_beta = tl.load(BETA + r64 * HV + hv, mask=r_ok, other=0.0).to(tl.float32)
            # Log2 decay from the leaf's first row (times log2(e)); masked before exp2, where it would overflow.
            gc = tl.cumsum(b_g, 0) * 1.4426950408889634
            diff = gc[:, None] - gc[None, :]
            kk_t = _dot(b_k, tl.trans(b_k), IEEE)
            A = tl.where(lower, b_beta[:, None] * kk_t * tl.exp2(tl.where(lower, diff, 0.0)), 0.0)
            # T = (I + A)^-1 by blocks of HALF rows: forward substitution within both
            # diagonal blocks at once (row r of each block from the rows above it),
            # then the block below the diagonal, T21 = -T22 A21 T11. In float32
            # products: the power series of A loses every digit for correlated keys.
            eye = tl.where(idx[:, None] == idx[None, :], 1.0, 0.0).to(A.dtype)
            T = eye
            for r in range(1, tl.minimum(length, HALF)):
                row = (idx % HALF) == r
                T = tl.where(row[:, None], eye - _exact_dot(tl.where(row[:, None] & diagonal, A, 0.0), T), T)
            if length > HALF:
                T -= _exact_dot(_exact_dot(T, tl.where(diagonal, 0.0, A)), T)
            e = tl.exp2(gc)
            b_v = tl.load(V + r64[:, None] * HV * DV + hv * DV + vv[None, :], mask=r_ok[:, None] & v_ok[None, :],
                          other=0.0)
            b_q = tl.load(Q + r64[:, None] * H * DK + h * DK + kk[None, :], mask=qk_mask, other=0.0)
            qk_t = _dot(b_q, tl.trans(b_k), IEEE)
            P = tl.where(causal, qk_t * tl.exp2(tl.where(causal, diff, 0.0)), 0.0)
            first = tl.load(INITIAL + n)
            src = POOL + first.to(tl.int64) * HV * DK * DV + hv * DK * DV
            S = tl.load(src + kk[:, None] * DV + vv[None, :], mask=k_ok[:, None] & v_ok[None, :] & (first >= 0),
                        other=0.0)
            # The chunked pass's roundings: its WY factors, corrected values and
            # entering states cross memory in the inputs' dtype.
            dt = b_k.dtype
            w = _dot(T.to(dt), (b_k.to(tl.float32) * (b_beta * e)[:, None]).to(dt), IEEE)
            u = _dot(T.to(dt), (b_v.to(tl.float32) * b_beta[:, None]).to(dt), IEEE)
            S_in = S.to(dt)
            v_new = u.to(dt).to(tl.float32) - _dot(w.to(dt), S_in, IEEE)
            o = _dot(b_q, S_in, IEEE) * e[:, None] + _dot(P.to(dt), v_new.to(dt), IEEE)
            tl.store(O + r64[:, None] * HV * DV + hv * DV + vv[None, :], (o * scale).to(O.dtype.element_ty),
                     mask=r_ok[:, None] & v_ok[None, :])


def gated_delta_rule_leaves_triton(
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
    leaves: torch.Tensor,
    out: torch.Tensor,
    programs: Optional[int] = None,
) -> torch.Tensor:
    """Own Triton kernel for short leaf segments; arguments and result as
    :func:`~.reference.gated_delta_rule_leaves_ref`, plus ``programs`` (programs
    per value head and value block, each taking every such-th entry of
    ``leaves``; default ``min(len(leaves), LEAF_PROGRAMS)``, fixed per table
    size so a CUDA graph replays the launch). Every tensor must be contiguous;
    the segment table and ``leaves`` int32 or int64 on the device.

    The kernel does not check leaf lengths: a listed segment longer than
    ``LEAF_ROWS`` gets wrong rows (the round's tables list none).

    Raises:
        ValueError: HV not a multiple of H.
    """
    T, HV, DV = v.shape
    H, DK = k.shape[1], k.shape[2]
    check_heads(H, HV)
    N = leaves.numel()
    if N == 0 or T == 0:
        return out
    BLOCK_V, warps, stages = LEAF_CONFIG
    BLOCK_V = min(BLOCK_V, max(16, triton.next_power_of_2(DV)))
    programs = programs or min(N, LEAF_PROGRAMS)
    _gdn_leaves_kernel[(triton.cdiv(DV, BLOCK_V), programs, HV)](
        q, k, v, g, beta, out, state_pool, seg_start, seg_len, initial_slot, leaves, N, float(scale),
        H=H, HV=HV, DK=DK, DV=DV, BT=LEAF_ROWS, BK=max(16, triton.next_power_of_2(DK)), BLOCK_V=BLOCK_V,
        IEEE=k.dtype == torch.float32, num_warps=warps, num_stages=stages,
    )
    return out
