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
``chunk`` (chunks of ``CHUNK`` = 64 rows aligned to each segment's start; within a chunk the
updates are solved at once through the unit-lower-triangular system
``(I + A) U = beta * (V - exp(gamma) K S_0)``, the WY/UT form of the delta rule,
Yang et al., 2024, "Parallelizing Linear Transformers with the Delta Rule over
Sequence Length", arXiv:2406.06484).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ..arguments import check_heads
from .chunks import CHUNK, chunk_rows


def _prepare(q, k, v, g, beta, scale, use_qk_l2norm):
    # float64 throughout, rounded once at the end: chunk boundaries (aligned to
    # each segment's start) then change no bits of the float32 result in practice.
    HV = v.shape[1]
    check_heads(k.shape[1], HV)
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
    out: Optional[torch.Tensor] = None,
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
        out: ``[T, HV, V]`` tensor to write the segments' rows into (other rows left
            as they are); a new zero tensor in ``v.dtype`` when None.

    Returns:
        ``out``: the segments' rows filled (other rows zero if ``out`` was None).

    Raises:
        ValueError: HV is not a multiple of H.
    """
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta, scale, use_qk_l2norm)
    if out is None:
        out = torch.zeros_like(v)
    HV, K, V = vf.shape[1], kf.shape[2], vf.shape[2]
    for start, n, first, last in _segments(seg_start, seg_len, initial_slot, final_slot):
        S = state_pool[first].double() if first >= 0 else vf.new_zeros(HV, K, V)
        rows = []
        for t in range(start, start + n):
            S = S * gf[t].exp()[:, None, None]
            predicted = torch.einsum("hkv,hk->hv", S, kf[t])
            delta = bf[t][:, None] * (vf[t] - predicted)
            S = S + kf[t][:, :, None] * delta[:, None, :]
            rows.append(torch.einsum("hkv,hk->hv", S, qf[t]))
        if n:
            out[start : start + n] = torch.stack(rows).to(out.dtype)
        if last >= 0:
            state_pool[last] = S.to(state_pool.dtype)
    return out


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
    out: Optional[torch.Tensor] = None,
    chunk_size: int = CHUNK,
) -> torch.Tensor:
    """Chunked reference; same arguments and result as
    :func:`recurrent_gated_delta_rule_ref`, plus ``chunk_size`` (chunks start at
    each segment's first row)."""
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta, scale, use_qk_l2norm)
    if out is None:
        out = torch.zeros_like(v)
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
            out[c0:c1] = O.transpose(0, 1).to(out.dtype)
            tail = (gamma[:, -1:] - gamma).exp()  # decay from each row to the chunk end
            S = gamma[:, -1].exp()[:, None, None] * S + (Kc * tail[:, :, None]).transpose(1, 2) @ U
        if last >= 0:
            state_pool[last] = S.to(state_pool.dtype)
    return out


def gated_delta_rule_tree_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state_pool: torch.Tensor,
    levels: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    use_qk_l2norm: bool = True,
    out: Optional[torch.Tensor] = None,
    tables=None,
    zero_padding: bool = True,
) -> torch.Tensor:
    """A whole prefix tree, level after level (each a :func:`chunk_gated_delta_rule_ref`
    call), so a level's segments read the slots the level before wrote.

    Args:
        q, k, v, g, beta, scale, state_pool, use_qk_l2norm, out: as
            :func:`chunk_gated_delta_rule_ref`.
        levels: per tree level ``(seg_start, seg_len, initial_slot, final_slot)``,
            ``[n]`` int64 each (:meth:`flide_ext.plan.flat.FlatPlan.level_tables`).
        tables: the GPU path's precomputed round tables (ignored here).
        zero_padding: False lets the GPU table pass leave the rows past the
            round undefined, for a caller that zeroes them itself (the GDN
            layer's output norm); here they are zeros either way.

    Returns:
        ``[T, HV, V]`` in ``v.dtype``: ``out`` when given; rows outside every
        segment are zeros (or left as they were in ``out``).

    Raises:
        ValueError: HV is not a multiple of H.
    """
    if out is None:
        out = torch.zeros_like(v)
    for level in levels:
        chunk_gated_delta_rule_ref(q, k, v, g, beta, scale, state_pool, *level, use_qk_l2norm=use_qk_l2norm, out=out)
    return out


def chunk_states_ref(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of the inter-chunk step of the chunked gated delta rule with
    forked states: the state entering each chunk, and each chunk's corrected values.

    With the WY form of each chunk (``w``, ``u``: Yang et al., 2024,
    arXiv:2406.06484), per sequence and value head, starting from
    ``S = state_pool[initial_slot]`` (zeros for -1)::

        h[c]   = S                                   (state entering chunk c)
        v_new  = u_c - w_c @ S
        S      = 2**g_last * S + k_c^T @ (2**(g_last - g_c) * v_new)

    and the final ``S`` goes to ``state_pool[final_slot]`` (skipped for -1).

    Args:
        k: ``[T, H, K]`` L2-normalised keys (H divides HV).
        w: ``[T, HV, K]``, u: ``[T, HV, V]``: the chunks' WY factors.
        g_cum: ``[T, HV]`` float32 log2 decay summed from each chunk's start.
        state_pool: ``[N, HV, K, V]`` states; written in place.
        cu_seqlens: ``[S+1]`` int64 sequence bounds (chunks start at each bound).
        chunk_offsets: ``[S+1]`` int64 index of each sequence's first chunk.
        initial_slot, final_slot: ``[S]`` int64 slots, -1 for zeros / not kept.
        chunk_size: rows per chunk.

    Returns:
        ``h`` ``[NT, HV, K, V]`` in ``k.dtype`` and ``v_new`` ``[T, HV, V]`` in ``u.dtype``.

    Raises:
        ValueError: HV is not a multiple of H.
    """
    HV, Kd, V = w.shape[1], k.shape[2], u.shape[2]
    check_heads(k.shape[1], HV)
    group = HV // k.shape[1]
    NT = int(chunk_offsets[-1])
    h = torch.zeros(NT, HV, Kd, V, dtype=k.dtype, device=k.device)
    v_new = torch.zeros_like(u)
    bounds = cu_seqlens.tolist()
    for n, (first, last) in enumerate(zip(initial_slot.tolist(), final_slot.tolist())):
        S = state_pool[first].double() if first >= 0 else torch.zeros(HV, Kd, V, dtype=torch.float64, device=k.device)
        for c, t0 in enumerate(range(bounds[n], bounds[n + 1], chunk_size)):
            t1 = min(t0 + chunk_size, bounds[n + 1])
            h[int(chunk_offsets[n]) + c] = S.to(h.dtype)
            kc = k[t0:t1].double().repeat_interleave(group, dim=1).transpose(0, 1)  # [HV, L, K]
            wc, uc = w[t0:t1].double().transpose(0, 1), u[t0:t1].double().transpose(0, 1)
            gc = g_cum[t0:t1].double().t()  # [HV, L]
            vn = uc - wc @ S
            v_new[t0:t1] = vn.transpose(0, 1).to(v_new.dtype)
            g_last = gc[:, -1:]
            S = torch.exp2(g_last)[:, :, None] * S + kc.transpose(1, 2) @ (torch.exp2(g_last - gc)[:, :, None] * vn)
        if last >= 0:
            state_pool[last] = S.to(state_pool.dtype)
    return h, v_new


def chunk_local_cumsum_ref(g: torch.Tensor, cu_seqlens: torch.Tensor, chunk_size: int = CHUNK) -> torch.Tensor:
    """Log decay in base 2, summed from each chunk's first row (chunks start at
    each sequence bound): ``g_cum[t] = log2(e) * sum(g[c0..t])``.

    Args:
        g: ``[T, HV]`` natural-log gates (float32).
        cu_seqlens: ``[S+1]`` int64 sequence bounds.

    Returns:
        ``[T, HV]`` float32.
    """
    out = torch.zeros(g.shape, dtype=torch.float32, device=g.device)
    for t0, t1 in chunk_rows(cu_seqlens.tolist(), chunk_size):
        out[t0:t1] = (g[t0:t1].double().cumsum(0) / math.log(2)).float()
    return out


def chunk_wy_ref(k, v, g_cum, beta, cu_seqlens, chunk_size: int = CHUNK):
    """The chunks' WY factors (Yang et al., 2024, arXiv:2406.06484, the UT
    transform): with ``A[i, j] = beta_i k_i.k_j 2**(g_i - g_j)`` for ``j < i``
    within a chunk and ``T = (I + A)^-1``, ``w = T (beta 2**g k)`` and
    ``u = T (beta v)``, per value head.

    Args:
        k: ``[T, H, K]`` (L2-normalised) keys, H divides HV.
        v: ``[T, HV, V]``; g_cum: ``[T, HV]`` from :func:`chunk_local_cumsum_ref`;
        beta: ``[T, HV]``; cu_seqlens: ``[S+1]`` int64.

    Returns:
        ``w`` ``[T, HV, K]`` in ``k.dtype`` and ``u`` ``[T, HV, V]`` in ``v.dtype``.

    Raises:
        ValueError: HV is not a multiple of H.
    """
    HV = v.shape[1]
    check_heads(k.shape[1], HV)
    w = torch.zeros(k.shape[0], HV, k.shape[2], dtype=k.dtype, device=k.device)
    u = torch.zeros_like(v)
    for t0, t1 in chunk_rows(cu_seqlens.tolist(), chunk_size):
        kc = k[t0:t1].double().repeat_interleave(HV // k.shape[1], dim=1).transpose(0, 1)  # [HV, L, K]
        gc, bc = g_cum[t0:t1].double().t(), beta[t0:t1].double().t()  # [HV, L]
        L = t1 - t0
        A = (bc[:, :, None] * (kc @ kc.transpose(1, 2)) * torch.exp2(gc[:, :, None] - gc[:, None, :])).tril(-1)
        system = A + torch.eye(L, dtype=A.dtype, device=k.device)
        rhs_w = (bc * torch.exp2(gc))[:, :, None] * kc
        rhs_u = bc[:, :, None] * v[t0:t1].double().transpose(0, 1)
        w[t0:t1] = torch.linalg.solve_triangular(system, rhs_w, upper=False, unitriangular=True).transpose(0, 1).to(w.dtype)
        u[t0:t1] = torch.linalg.solve_triangular(system, rhs_u, upper=False, unitriangular=True).transpose(0, 1).to(u.dtype)
    return w, u


def chunk_output_ref(q, k, v_new, h, g_cum, scale, cu_seqlens, chunk_size: int = CHUNK):
    """Chunk outputs from the states entering each chunk (Yang et al., 2024,
    arXiv:2406.06484): ``o = scale * (2**g * (q h) + ((q k^T) * D) v_new)`` with
    ``D[i, j] = 2**(g_i - g_j)`` for ``j <= i`` within the chunk, per value head.

    Args:
        q, k: ``[T, H, K]`` (L2-normalised); v_new: ``[T, HV, V]``;
        h: ``[NT, HV, K, V]`` state entering each chunk, chunks numbered in
            ``cu_seqlens`` order; g_cum: ``[T, HV]``; scale: query scale;
        cu_seqlens: ``[S+1]`` int64.

    Returns:
        ``[T, HV, V]`` in ``v_new.dtype``.

    Raises:
        ValueError: HV is not a multiple of H.
    """
    HV = v_new.shape[1]
    check_heads(k.shape[1], HV)
    group = HV // k.shape[1]
    o = torch.zeros_like(v_new)
    for c, (t0, t1) in enumerate(chunk_rows(cu_seqlens.tolist(), chunk_size)):
        qc = q[t0:t1].double().repeat_interleave(group, dim=1).transpose(0, 1) * scale
        kc = k[t0:t1].double().repeat_interleave(group, dim=1).transpose(0, 1)
        gc = g_cum[t0:t1].double().t()
        L = t1 - t0
        causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        D = torch.exp2(gc[:, :, None] - gc[:, None, :]).masked_fill(~causal, 0.0)
        oc = torch.exp2(gc)[:, :, None] * (qc @ h[c].double()) + ((qc @ kc.transpose(1, 2)) * D) @ v_new[t0:t1].double().transpose(0, 1)
        o[t0:t1] = oc.transpose(0, 1).to(o.dtype)
    return o
