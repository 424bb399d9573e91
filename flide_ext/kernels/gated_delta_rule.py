"""Gated delta rule over varlen segments with forked initial states.

The Gated DeltaNet recurrence (Yang, Kautz & Hatamizadeh, 2024, "Gated Delta
Networks: Improving Mamba2 with Delta Rule", arXiv:2412.06464), with the state
S as a ``[K, V]`` matrix per value head:

    S_t = exp(g_t) * (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T (scale * q_t)

Each segment starts from ``state_pool[initial_slot]`` (zeros for -1) and its
final state is written to ``state_pool[final_slot]``: a child segment reads its
parent's state by index, so forking a state to many questions copies nothing.

Two reference forms with one signature: ``recurrent`` (token by token) and
``chunk`` (chunks of 64 aligned to each segment's start; within a chunk the
updates are solved at once through the unit-lower-triangular system
``(I + A) U = beta * (V - exp(gamma) K S_0)``, the WY/UT form of the delta rule,
Yang et al., 2024, "Parallelizing Linear Transformers with the Delta Rule over
Sequence Length", arXiv:2406.06484).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _prepare(q, k, v, g, beta, scale, use_qk_l2norm):
    # float64 throughout, rounded once at the end: chunk boundaries (aligned to
    # each segment's start) then change no bits of the float32 result in practice.
    HV = v.shape[1]
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    if use_qk_l2norm:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if q.shape[1] != HV:  # grouped value heads: each key head serves HV/H value heads
        q = q.repeat_interleave(HV // q.shape[1], dim=1)
        k = k.repeat_interleave(HV // k.shape[1], dim=1)
    return q * scale, k, v, g, beta


def _segments(seg_start, seg_len, initial_slot, final_slot):
    return zip(seg_start.tolist(), seg_len.tolist(), initial_slot.tolist(), final_slot.tolist())


def recurrent_gated_delta_rule_ref(
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
) -> torch.Tensor:
    """Token-by-token reference.

    Args:
        q, k: ``[T, H, K]`` queries and keys (H divides HV).
        v: ``[T, HV, V]`` values.
        g: ``[T, HV]`` log decay (<= 0). beta: ``[T, HV]`` write strength in (0, 1).
        scale: query scale, usually ``K ** -0.5``.
        state_pool: ``[N, HV, K, V]`` recurrent states (float32); written in place.
        seg_start, seg_len: ``[S]`` int64 rows of the segments to run.
        initial_slot: ``[S]`` int64 slot of each segment's initial state, -1 for zeros.
        final_slot: ``[S]`` int64 slot for each segment's final state, -1 to skip.
        use_qk_l2norm: L2-normalise q and k per head first (eps 1e-6).

    Returns:
        ``[T, HV, V]`` outputs in ``v.dtype`` (rows outside the segments zero).
    """
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta, scale, use_qk_l2norm)
    out = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    HV, K, V = vf.shape[1], kf.shape[2], vf.shape[2]
    for start, n, first, last in _segments(seg_start, seg_len, initial_slot, final_slot):
        S = state_pool[first].double() if first >= 0 else vf.new_zeros(HV, K, V)
        for t in range(start, start + n):
            S = S * gf[t].exp()[:, None, None]
            predicted = torch.einsum("hkv,hk->hv", S, kf[t])
            delta = bf[t][:, None] * (vf[t] - predicted)
            S = S + kf[t][:, :, None] * delta[:, None, :]
            out[t] = torch.einsum("hkv,hk->hv", S, qf[t])
        if last >= 0:
            state_pool[last] = S.to(state_pool.dtype)
    return out.to(v.dtype)


def chunk_gated_delta_rule_ref(
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
    chunk_size: int = 64,
) -> torch.Tensor:
    """Chunked reference; same arguments and result as
    :func:`recurrent_gated_delta_rule_ref`, plus ``chunk_size`` (chunks start at
    each segment's first row)."""
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta, scale, use_qk_l2norm)
    out = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    HV, K, V = vf.shape[1], kf.shape[2], vf.shape[2]
    for start, n, first, last in _segments(seg_start, seg_len, initial_slot, final_slot):
        S = state_pool[first].double() if first >= 0 else vf.new_zeros(HV, K, V)
        for c0 in range(start, start + n, chunk_size):
            c1 = min(c0 + chunk_size, start + n)
            # Heads first: [HV, L, ...]
            Q, Kc, Vc = qf[c0:c1].transpose(0, 1), kf[c0:c1].transpose(0, 1), vf[c0:c1].transpose(0, 1)
            b = bf[c0:c1].t()  # [HV, L]
            gamma = gf[c0:c1].t().cumsum(-1)  # log decay from the chunk start to each row
            L = c1 - c0
            causal = torch.ones(L, L, dtype=torch.bool, device=v.device).tril()
            decay = (gamma[:, :, None] - gamma[:, None, :]).masked_fill(~causal, float("-inf")).exp()
            kk = Kc @ Kc.transpose(1, 2)
            A = (b[:, :, None] * kk * decay).tril(-1)
            system = A + torch.eye(L, dtype=A.dtype, device=v.device)
            rhs = b[:, :, None] * (Vc - gamma.exp()[:, :, None] * (Kc @ S))
            U = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
            O = gamma.exp()[:, :, None] * (Q @ S) + ((Q @ Kc.transpose(1, 2)) * decay) @ U
            out[c0:c1] = O.transpose(0, 1)
            tail = (gamma[:, -1:] - gamma).exp()  # decay from each row to the chunk end
            S = gamma[:, -1].exp()[:, None, None] * S + (Kc * tail[:, :, None]).transpose(1, 2) @ U
        if last >= 0:
            state_pool[last] = S.to(state_pool.dtype)
    return out.to(v.dtype)


def chunk_gated_delta_rule(*args, **kwargs) -> torch.Tensor:
    """Dispatch; same signature as :func:`chunk_gated_delta_rule_ref` (reference only so far)."""
    return chunk_gated_delta_rule_ref(*args, **kwargs)
