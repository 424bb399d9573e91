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

Keys are reduced in *chunks* of ``CHUNK`` path offsets (also aligned to the
path's start) and the chunks in *groups* (the first ``GROUPS - 1`` chunks one
group each, the rest one last group): each chunk is an online softmax from
nothing, chunks fold into their group and groups into the row's result in
order. A round of few rows (at most ``SPLIT_ROWS``) on long paths runs one
program per (block, group) and a second launch that folds the groups, the
split-KV scheme of Flash-Decoding (Dao et al., 2023); others run one program
per block that walks the groups itself. The operations and their order are
the same, so a row's bits do not depend on which launch computed it: a step
resumed from a checkpoint (a few hundred rows, split) gets the bits of the cold
round that left the checkpoint (thousands of rows, walked).

Online softmax as in FlashAttention (Dao et al., 2022, arXiv:2205.14135), with
float32 statistics and accumulator.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..round_cache import round_cache
from .key_groups import _combine_kernel, _fold, _group
from .paths import block_arrays, host_array, path_tables

@triton.jit
def _fork_attention_kernel(
    Q, K, V, O, POS, KV_POS, KV_INDEX, PART_ML, PART_ACC,
    BLOCK_SEG, BLOCK_ROW,
    SEG_START, SEG_LEN, SEG_OFFSET,
    PATH_KV, PATH_OFFSET, PATH_LEN,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    qk_scale, window,
    GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DEPTH: tl.constexpr,
    CHUNK: tl.constexpr, GROUPS: tl.constexpr, SPLIT: tl.constexpr,
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
        q_pos = rows
        lo = 0
    if PACK_GQA:
        hi = own + tl.minimum(row0 + BLOCK_M // GROUP, n)
    else:
        hi = own + tl.minimum(row0 + BLOCK_M, n)
    # The key groups holding any of this block's tiles.
    g_lo = tl.minimum(lo // CHUNK, GROUPS - 1)
    g_hi = tl.minimum(tl.cdiv(hi, CHUNK), GROUPS)
    out_mask = row_ok[:, None] & (dv[None, :] < DV)
    out_ptr = O + t[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :]
    if SPLIT:
        g = tl.program_id(2)
        if (g >= g_lo) & (g < g_hi) & (hi > lo):
            q = tl.load(Q + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                        mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
            m, l, acc = _group(q, K, V, KV_POS, KV_INDEX, kv_head, q_offset, q_pos, path_kv, path_lo, path_hi,
                               stride_kt, stride_kh, stride_vt, stride_vh, qk_scale, window, g, lo, hi,
                               D, DV, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, CHUNK, GROUPS,
                               HAS_WINDOW, IEEE, HAS_INDEX)
            if g_hi - g_lo == 1:
                out = acc / tl.where(l > 0, l, 1.0)[:, None]
                tl.store(out_ptr, out.to(O.dtype.element_ty), mask=out_mask)
            else:
                # Partial of (block, head slot, group), folded by _combine_kernel.
                part = (block * tl.num_programs(1) + tl.program_id(1)) * GROUPS + g
                tl.store(PART_ML + (part * 2) * BLOCK_M + r, m)
                tl.store(PART_ML + (part * 2 + 1) * BLOCK_M + r, l)
                tl.store(PART_ACC + part * BLOCK_M * BLOCK_DV + r[:, None] * BLOCK_DV + dv[None, :], acc)
    else:
        q = tl.load(Q + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                    mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        for g in range(g_lo, g_hi):
            m2, l2, acc2 = _group(q, K, V, KV_POS, KV_INDEX, kv_head, q_offset, q_pos, path_kv, path_lo, path_hi,
                                  stride_kt, stride_kh, stride_vt, stride_vh, qk_scale, window, g, lo, hi,
                                  D, DV, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, CHUNK, GROUPS,
                                  HAS_WINDOW, IEEE, HAS_INDEX)
            m, l, acc = _fold(m, l, acc, m2, l2, acc2)
        out = acc / tl.where(l > 0, l, 1.0)[:, None]
        tl.store(out_ptr, out.to(O.dtype.element_ty), mask=out_mask)


# Tile shapes, fixed per (head size, dtype, GQA group) and never per round, so
# a question's tiles do not depend on what else is in the round. Chosen on the
# H200 by benchmark/kernels/sweep_kernels.py (benchmark/results/kernels/sweep.json).
# (BLOCK_M rows, BLOCK_N keys, num_warps, num_stages, pack GQA heads into rows)
TILE_OVERRIDE = None


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
    return 128, 64, 8, 2, True


# Key groups: a row's keys are reduced chunk by chunk, ``CHUNK`` path offsets
# each from the path's start, the first ``GROUPS - 1`` chunks one group each
# and the rest one last group; chunks fold into their group and groups into the
# row's result in order (_fold). Like the tiles, fixed per (head size, dtype,
# GQA group), so a row's reduction depends on its own path alone. How the
# groups are run is free: one program walks them all, or (rounds of at most
# SPLIT_ROWS stream rows: few query blocks on a long path leave SMs idle) one
# program per group writes partials that a second launch folds, the same
# operations in the same order, so both give the same bits.
# (CHUNK path offsets, a multiple of every BLOCK_N; GROUPS)
SPLIT_OVERRIDE = None
SPLIT_ROWS = 1024


def _split_config(D: int, dtype: torch.dtype, group: int) -> tuple[int, int]:
    if SPLIT_OVERRIDE is not None:
        return SPLIT_OVERRIDE
    return 512, 16


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
    :func:`flide_ext.kernels.fork_attention.reference.fork_attention_ref` (head sizes up to 256).

    ``tables``: the round's precomputed metadata
    (:attr:`flide_ext.kernels.tables.KernelTables.attention`, built for this
    model's tile shape); then the launch's grid is the tables' block count and
    nothing is derived from the segment tensors here (CUDA graphs).

    ``kv_index``: ``[Tk']`` int32/int64 pool row of each key-array position; then
    ``k`` and ``v`` are K/V pools ``[N, Hkv, D]`` / ``[N, Hkv, Dv]`` read in place
    (rows no path reaches are never loaded). Same tiles and order as without it:
    the result has the bits of the contiguous key array ``k[kv_index]``. Values are
    not range-checked (no host sync).

    Float32 inputs use IEEE float32 dot products (no TF32); bf16/fp16 inputs use
    the tensor cores with float32 accumulation.

    Raises:
        ValueError: a head size over 256, or a segment path deeper than
            ``PATH_DEPTH``. With a sliding window, positions must run contiguously
            along each path (as :func:`flide_ext.plan.flat.plan_round` lays them out):
            key tiles before the window's reach are skipped.
    """
    T, Hq, D = q.shape
    Hkv, DV = k.shape[1], v.shape[2]
    if max(D, DV) > 256:
        raise ValueError(f"head size {max(D, DV)} is over 256")
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
    total, block_seg, block_row, starts, lens, own, path_kv, path_offset, path_len = tables
    if total == 0:
        return out
    window = int(sliding_window) if sliding_window is not None else 0
    positions = positions.contiguous()
    # Without an index the kernel never reads KV_INDEX: any pointer will do.
    index = kv_index.contiguous() if kv_index is not None else positions
    chunk, groups = _split_config(D, q.dtype, group)
    heads = Hkv if pack else Hq
    BLOCK_DV = triton.next_power_of_2(max(DV, 16))
    split = T <= SPLIT_ROWS
    if split:
        part_ml = torch.empty(total * heads * groups * 2 * BLOCK_M, dtype=torch.float32, device=q.device)
        part_acc = torch.empty(total * heads * groups * BLOCK_M * BLOCK_DV, dtype=torch.float32, device=q.device)
    else:  # never read: any pointer will do
        part_ml = part_acc = out
    common = dict(GROUP=group, DV=DV, BLOCK_DV=BLOCK_DV, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CHUNK=chunk,
                  GROUPS=groups, HAS_WINDOW=sliding_window is not None, PACK_GQA=pack)
    _fork_attention_kernel[(total, heads, groups if split else 1)](
        q, k, v, out, positions, kv_positions.contiguous(), index, part_ml, part_acc,
        block_seg, block_row,
        starts, lens, own,
        path_kv, path_offset, path_len,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        scale * 1.4426950408889634, window,
        D=D, BLOCK_D=triton.next_power_of_2(max(D, 16)), DEPTH=path_kv.shape[1], SPLIT=split,
        IEEE=q.dtype == torch.float32, HAS_INDEX=kv_index is not None, **common,
        num_warps=warps, num_stages=stages,
    )
    if split:
        _combine_kernel[(total, heads)](
            out, part_ml, part_acc, positions, block_seg, block_row, starts, lens, own,
            out.stride(0), out.stride(1), window, **common, num_warps=warps,
        )
    return out
