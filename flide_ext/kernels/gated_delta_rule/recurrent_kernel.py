"""Gated delta rule token by token in Triton, states forked by index: one
program per segment, value head and ``BLOCK_V`` value columns, the state in
float32 registers. Arguments and result as
:func:`flide_ext.kernels.gated_delta_rule.reference.recurrent_gated_delta_rule_ref`."""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..arguments import check_heads, check_written

# (BLOCK_V, num_warps) of the recurrent kernel; chosen on the H200 by
# benchmark/kernels/sweep_kernels.py.
RECURRENT_CONFIG = (32, 1)


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
    result as :func:`flide_ext.kernels.gated_delta_rule.reference.recurrent_gated_delta_rule_ref`.
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
