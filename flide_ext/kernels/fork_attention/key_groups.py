"""ForkAttention's key groups in Triton: the online softmax of one chunk of key
tiles, a group of chunks, the fold of two partials, and the split grid's
combine launch (the scheme: :mod:`.kernel`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _fold(m, l, acc, m2, l2, acc2):
    # (m, l, acc) + (m2, l2, acc2): two online-softmax partials over disjoint
    # keys. An empty side (m = -inf) leaves the other's bits unchanged, so an
    # empty chunk or group folds as nothing. Explicit FMAs: the split grid's
    # combine and the one-program walk must round alike, whatever the compiler
    # would contract in each.
    empty1 = m == float("-inf")
    empty2 = m2 == float("-inf")
    m_new = tl.maximum(m, m2)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp2(m - m_safe)
    b = tl.exp2(m2 - m_safe)
    l_new = tl.where(empty2, l, tl.where(empty1, l2, tl.fma(l, a, l2 * b)))
    acc_new = tl.where(empty2[:, None], acc,
                       tl.where(empty1[:, None], acc2, tl.fma(acc, a[:, None], acc2 * b[:, None])))
    return m_new, l_new, acc_new


@triton.jit
def _chunk(q, K, V, KV_POS, KV_INDEX, kv_head, q_offset, q_pos, path_kv, path_lo, path_hi,
           stride_kt, stride_kh, stride_vt, stride_vh, qk_scale, window, j_lo, j_hi,
           D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr, HAS_INDEX: tl.constexpr):
    # Online softmax of the block's rows over the key tiles [j_lo, j_hi), from
    # nothing: -> (m, l, acc) unnormalised.
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for j in range(j_lo, j_hi, BLOCK_N):
        p = j + tl.arange(0, BLOCK_N)
        inside = (p[:, None] >= path_lo[None, :]) & (p[:, None] < path_hi[None, :])
        key_row = tl.sum(tl.where(inside, path_kv[None, :] + p[:, None] - path_lo[None, :], 0), axis=1).to(tl.int64)
        key_ok = tl.sum(inside.to(tl.int32), axis=1) > 0
        if HAS_INDEX:
            # key_row is the key-array position; K and V live at its pool row.
            kv_row = tl.load(KV_INDEX + key_row, mask=key_ok, other=0).to(tl.int64)
        else:
            kv_row = key_row
        k = tl.load(K + kv_row[:, None] * stride_kt + kv_head * stride_kh + d[None, :],
                    mask=key_ok[:, None] & (d[None, :] < D), other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        visible = key_ok[None, :] & (p[None, :] <= q_offset[:, None])
        if HAS_WINDOW:
            k_pos = tl.load(KV_POS + key_row, mask=key_ok, other=0)
            visible = visible & (q_pos[:, None] - k_pos[None, :] < window)
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        prob = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(prob, axis=1)
        v = tl.load(V + kv_row[:, None] * stride_vt + kv_head * stride_vh + dv[None, :],
                    mask=key_ok[:, None] & (dv[None, :] < DV), other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _group(q, K, V, KV_POS, KV_INDEX, kv_head, q_offset, q_pos, path_kv, path_lo, path_hi,
           stride_kt, stride_kh, stride_vt, stride_vh, qk_scale, window, g, lo, hi,
           D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, GROUPS: tl.constexpr,
           HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr, HAS_INDEX: tl.constexpr):
    # Key group g: chunk g (CHUNK path offsets from the path's start) or, for
    # the last group, every chunk from GROUPS - 1 on, folded in order.
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    c_end = g + 1
    if g == GROUPS - 1:
        c_end = tl.maximum(tl.cdiv(hi, CHUNK), g + 1)
    for c in range(g, c_end):
        m2, l2, acc2 = _chunk(q, K, V, KV_POS, KV_INDEX, kv_head, q_offset, q_pos, path_kv, path_lo, path_hi,
                              stride_kt, stride_kh, stride_vt, stride_vh, qk_scale, window,
                              tl.maximum(lo, c * CHUNK), tl.minimum(hi, (c + 1) * CHUNK),
                              D, DV, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, HAS_WINDOW, IEEE, HAS_INDEX)
        m, l, acc = _fold(m, l, acc, m2, l2, acc2)
    return m, l, acc


@triton.jit
def _combine_kernel(
    O, PART_ML, PART_ACC, POS,
    BLOCK_SEG, BLOCK_ROW, SEG_START, SEG_LEN, SEG_OFFSET,
    stride_ot, stride_oh, window,
    GROUP: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, GROUPS: tl.constexpr,
    HAS_WINDOW: tl.constexpr, PACK_GQA: tl.constexpr,
):
    # The split grid's second launch: folds each block's group partials in
    # group order, as the one-program walk does, and writes the output.
    block = tl.program_id(0)
    r = tl.arange(0, BLOCK_M)
    if PACK_GQA:
        token = r // GROUP
        head = tl.program_id(1) * GROUP + r % GROUP
    else:
        token = r
        head = tl.program_id(1) + r * 0
    seg = tl.load(BLOCK_SEG + block)
    row0 = tl.load(BLOCK_ROW + block)
    start = tl.load(SEG_START + seg)
    n = tl.load(SEG_LEN + seg)
    own = tl.load(SEG_OFFSET + seg)
    rows = row0 + token
    row_ok = rows < n
    t = (start + rows).to(tl.int64)
    dv = tl.arange(0, BLOCK_DV)
    if HAS_WINDOW:
        lo = tl.maximum(own + row0 - window + 1, 0) // BLOCK_N * BLOCK_N
    else:
        lo = 0
    if PACK_GQA:
        hi = own + tl.minimum(row0 + BLOCK_M // GROUP, n)
    else:
        hi = own + tl.minimum(row0 + BLOCK_M, n)
    g_lo = tl.minimum(lo // CHUNK, GROUPS - 1)
    g_hi = tl.minimum(tl.cdiv(hi, CHUNK), GROUPS)
    if (g_hi - g_lo > 1) & (hi > lo):
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        for g in range(g_lo, g_hi):
            part = (block * tl.num_programs(1) + tl.program_id(1)) * GROUPS + g
            m2 = tl.load(PART_ML + (part * 2) * BLOCK_M + r)
            l2 = tl.load(PART_ML + (part * 2 + 1) * BLOCK_M + r)
            acc2 = tl.load(PART_ACC + part * BLOCK_M * BLOCK_DV + r[:, None] * BLOCK_DV + dv[None, :])
            m, l, acc = _fold(m, l, acc, m2, l2, acc2)
        out = acc / tl.where(l > 0, l, 1.0)[:, None]
        tl.store(O + t[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :], out.to(O.dtype.element_ty),
                 mask=row_ok[:, None] & (dv[None, :] < DV))
