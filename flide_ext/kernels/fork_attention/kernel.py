"""ForkAttention in Triton: varlen flat stream, segment paths walked by index.

Same signature and result as :func:`flide_ext.kernels.fork_attention.reference.fork_attention_ref`.

One program runs ``BLOCK_M`` query rows of one segment for one query head. Its
keys are the segment's root-to-leaf path: the segments' key rows laid end to
end give each key a *path offset* (0 at the root's first key). Key tiles are
``BLOCK_N`` path offsets wide and aligned to multiples of ``BLOCK_N`` from the
path's start, whatever segments the path is cut into; each tile's rows are found
through the path table (``paths.PATH_DEPTH`` segments), never through a mask of
the stream. A question therefore meets the same keys in the same tiles and in
the same order whether it is alone (one segment holding state and question),
forked from a shared state, or resumed from a checkpoint: its softmax is reduced
identically and its output has the same bits. Tiles with no visible key for a
row change nothing for that row (scale 1, add 0), so how rows are grouped into
blocks does not matter either.

The path table gives each key its key-array position. With ``kv_index``
(``HAS_INDEX``) that position's K and V are loaded from row ``kv_index[position]``
of the K/V pools, in place, while ``kv_positions`` stays indexed by key-array
position; tiles and their order do not change, so an index over a pool gives the
bits of the equivalent contiguous key array.

Online softmax as in FlashAttention (Dao et al., 2022, arXiv:2205.14135), with
float32 statistics and accumulator.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..round_cache import round_cache
from .paths import block_arrays, host_array, path_tables

@triton.jit
def _fork_attention_kernel(
    Q, K, V, O, POS, KV_POS, KV_INDEX,
    BLOCK_SEG, BLOCK_ROW,
    SEG_START, SEG_LEN, SEG_OFFSET,
    PATH_KV, PATH_OFFSET, PATH_LEN,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    qk_scale, window,
    GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DEPTH: tl.constexpr,
    HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr, PACK_GQA: tl.constexpr, HAS_INDEX: tl.constexpr,
):
    block = tl.program_id(0)
    r = tl.arange(0, BLOCK_M)
    if PACK_GQA:
        # The GROUP query heads sharing one KV head are rows of one tile: rows
        # are (token, head) pairs, so each key tile is loaded once per group.
        kv_head = tl.program_id(1)
        token = r // GROUP
        head = kv_head * GROUP + r % GROUP
    else:
        head = tl.program_id(1) + r * 0
        kv_head = tl.program_id(1) // GROUP
        token = r
    seg = tl.load(BLOCK_SEG + block)
    row0 = tl.load(BLOCK_ROW + block)
    start = tl.load(SEG_START + seg)
    n = tl.load(SEG_LEN + seg)
    own = tl.load(SEG_OFFSET + seg)

    rows = row0 + token
    row_ok = rows < n
    t = (start + rows).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
    q_offset = own + rows

    level = tl.arange(0, DEPTH)
    path_kv = tl.load(PATH_KV + seg * DEPTH + level)
    path_lo = tl.load(PATH_OFFSET + seg * DEPTH + level)
    path_hi = path_lo + tl.load(PATH_LEN + seg * DEPTH + level)

    if HAS_WINDOW:
        q_pos = tl.load(POS + t, mask=row_ok, other=0)
        # Positions run contiguously along a path, so offsets before this bound
        # are outside every row's window; skipped tiles would be no-ops anyway.
        lo = tl.maximum(own + row0 - window + 1, 0) // BLOCK_N * BLOCK_N
    else:
        lo = 0
    if PACK_GQA:
        hi = own + tl.minimum(row0 + BLOCK_M // GROUP, n)
    else:
        hi = own + tl.minimum(row0 + BLOCK_M, n)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for j in range(lo, hi, BLOCK_N):
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
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + t[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (dv[None, :] < DV))


# Tile shapes, fixed per (head size, dtype, GQA group) and never per round, so
# a question's tiles do not depend on what else is in the round. Chosen on the
# H200 by benchmark/kernels/sweep_kernels.py (benchmark/results/kernels/sweep.json).
# (BLOCK_M rows, BLOCK_N keys, num_warps, num_stages, pack GQA heads into rows)
TILE_OVERRIDE = None
MAX_HEAD_SIZE = 512


def tokens_per_block(D: int, dtype: torch.dtype, group: int) -> int:
    """Stream rows one program covers (the block size of the metadata tables)."""
    BLOCK_M, _, _, _, pack = _tile_config(D, dtype, group)
    pack = pack and group > 1 and BLOCK_M % group == 0
    return BLOCK_M // group if pack else BLOCK_M


def _tile_config(D: int, dtype: torch.dtype, group: int) -> tuple[int, int, int, int, bool]:
    if TILE_OVERRIDE is not None:
        return TILE_OVERRIDE
    if dtype == torch.float32:
        return 32, 32, 4, 1, False
    if D <= 128:
        return 64, 64, 4, 2, True
    if D <= 256:
        return 128, 64, 8, 2, True
    # Gemma 4's full layers (512): a tile of rows a program can hold beside its
    # float32 accumulator; not yet timed on a GPU.
    return 32, 32, 8, 1, False


def _build_metadata(seg_parent, seg_start, seg_len, seg_kv_start, seg_kv_len, block_m):
    device = seg_len.device
    path_kv, path_offset, path_len, own = path_tables(seg_parent, seg_kv_start, seg_kv_len)
    block_seg, block_row = (torch.from_numpy(a).to(device) for a in block_arrays(host_array(seg_len), block_m))
    return (block_seg.numel(), block_seg, block_row, seg_start.int(), seg_len.int(), own, path_kv, path_offset,
            path_len)


def fork_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg_parent: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    seg_kv_start: torch.Tensor,
    seg_kv_len: torch.Tensor,
    positions: torch.Tensor,
    kv_positions: torch.Tensor,
    scale: float,
    sliding_window: Optional[int] = None,
    tables: Optional[tuple] = None,
    kv_index: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Triton ForkAttention; arguments, shapes and result as
    :func:`flide_ext.kernels.fork_attention.reference.fork_attention_ref` (head sizes up to
    :data:`MAX_HEAD_SIZE`).

    ``tables``: the round's precomputed metadata by block size
    (:attr:`flide_ext.kernels.tables.KernelTables.attention`, holding this
    layer's tile shape); then the launch's grid is the tables' block count and
    nothing is derived from the segment tensors here (CUDA graphs).

    ``kv_index``: ``[Tk']`` int32/int64 pool row of each key-array position; then
    ``k`` and ``v`` are K/V pools ``[N, Hkv, D]`` / ``[N, Hkv, Dv]`` read in place
    (rows no path reaches are never loaded). Same tiles and order as without it:
    the result has the bits of the contiguous key array ``k[kv_index]``. Values are
    not range-checked (no host sync).

    Float32 inputs use IEEE float32 dot products (no TF32); bf16/fp16 inputs use
    the tensor cores with float32 accumulation.

    Raises:
        ValueError: a head size over :data:`MAX_HEAD_SIZE`, a segment path deeper than
            ``PATH_DEPTH``, or ``tables`` without this layer's block size.

    With a sliding window, positions must run contiguously along each path (as
    :func:`flide_ext.plan.flat.plan_round` lays them out): key tiles before the
    window's reach are skipped.
    """
    T, Hq, D = q.shape
    Hkv, DV = k.shape[1], v.shape[2]
    if max(D, DV) > MAX_HEAD_SIZE:
        raise ValueError(f"head size {max(D, DV)} is over {MAX_HEAD_SIZE}")
    out = torch.zeros(T, Hq, DV, dtype=q.dtype, device=q.device)
    if T == 0 or seg_len.numel() == 0:
        return out
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    group = Hq // Hkv
    BLOCK_M, BLOCK_N, warps, stages, pack = _tile_config(D, q.dtype, group)
    pack = pack and group > 1 and BLOCK_M % group == 0
    tokens_per_block = BLOCK_M // group if pack else BLOCK_M
    plan = (seg_parent, seg_start, seg_len, seg_kv_start, seg_kv_len)
    if tables is None:
        tables = round_cache.get(("fork_attention", tokens_per_block), plan,
                                 lambda: _build_metadata(*plan, tokens_per_block))
    elif tokens_per_block in tables:
        tables = tables[tokens_per_block]
    else:
        raise ValueError(f"the round's tables hold ForkAttention blocks of {sorted(tables)} rows, not this layer's "
                         f"{tokens_per_block} (head size {D}, {group} query heads per key head)")
    total, block_seg, block_row, starts, lens, own, path_kv, path_offset, path_len = tables
    if total == 0:
        return out
    window = int(sliding_window) if sliding_window is not None else 0
    positions = positions.contiguous()
    # Without an index the kernel never reads KV_INDEX: any pointer will do.
    index = kv_index.contiguous() if kv_index is not None else positions
    _fork_attention_kernel[(total, Hkv if pack else Hq)](
        q, k, v, out, positions, kv_positions.contiguous(), index,
        block_seg, block_row,
        starts, lens, own,
        path_kv, path_offset, path_len,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        scale * 1.4426950408889634, window,
        GROUP=group, D=D, DV=DV,
        BLOCK_D=triton.next_power_of_2(max(D, 16)), BLOCK_DV=triton.next_power_of_2(max(DV, 16)),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, DEPTH=path_kv.shape[1],
        HAS_WINDOW=sliding_window is not None, IEEE=q.dtype == torch.float32, PACK_GQA=pack,
        HAS_INDEX=kv_index is not None,
        num_warps=warps, num_stages=stages,
    )
    return out
