"""Experiments beside the whole-tree causal conv (``causal_conv1d_tree_triton``):
what bounds its time, and whether a per-row sources table beats its per-row
segment lookups. Diagnostics for ``sweep_kernels.py --only conv_variants``;
nothing here is imported by the package.

* :func:`conv_sources`: ``[T, W]`` int32, for each stream row the input each tap
  reads: a stream row (>= 0), zero (-1) or checkpoint window entry ``f`` of the
  conv pool flattened as ``slot * (W-1) + entry`` (stored ``-2 - f``); built from
  the round's kernel tables with torch ops (graph-capturable, once per round).
* :func:`conv_sources_triton`: the conv reading that table, one gather per tap,
  the same products summed in the same order as the tree kernel (its output is
  compared bit for bit).
* :func:`copy_tiles_triton`: the same tiles copied (strided input rows to a
  dense output), the bandwidth floor of any conv tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def conv_sources(token_segment, seg_start, seg_len, history, history_slot, width: int) -> torch.Tensor:
    """``[T, width]`` int32 sources table (see the module docstring).

    Args:
        token_segment: ``[T]`` int segment of each row; seg_start, seg_len:
            ``[S1]``; history: ``[S1, width-1]`` int (the tables' ``conv_history``);
            history_slot: ``[S1]`` int.
        width: the conv kernel width W.
    """
    hist = width - 1
    T = token_segment.numel()
    seg = token_segment.long()
    rows = torch.arange(T, device=seg.device)
    idx = rows - seg_start.long()[seg]
    inside = (idx >= 0) & (idx < seg_len.long()[seg])
    slot = history_slot.long()[seg]
    out = []
    for tap in range(width):
        src = idx - hist + tap
        own = inside & (src >= 0)
        before = inside & (src < 0)
        entry = history.long()[seg, (hist + src).clamp(0, max(hist - 1, 0))] if hist else torch.full_like(rows, -1)
        window = -2 - (slot * hist + (-2 - entry))
        from_history = torch.where(entry <= -2, window, entry)
        value = torch.where(own, rows - hist + tap, torch.where(before, from_history, torch.full_like(rows, -1)))
        out.append(value)
    return torch.stack(out, dim=1).to(torch.int32).contiguous()


@triton.jit
def _conv_sources_kernel(X, WEIGHT, POOL, OUT, SRC, T, C, stride_x,
                         WIDTH: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
                         SILU: tl.constexpr, WINDOWS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    r_ok = rows < T
    HIST: tl.constexpr = WIDTH - 1
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
    for tap in tl.static_range(WIDTH):
        s = tl.load(SRC + rows * WIDTH + tap, mask=r_ok, other=-1)
        xv = tl.load(X + tl.maximum(s, 0).to(tl.int64)[:, None] * stride_x + c[None, :],
                     mask=(s >= 0)[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
        if WINDOWS:
            f = tl.maximum(-2 - s, 0)
            wv = tl.load(POOL + (f // HIST).to(tl.int64)[:, None] * C * HIST + c[None, :] * HIST + (f % HIST)[:, None],
                         mask=(s <= -2)[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
            xv = xv + wv
        w_tap = tl.load(WEIGHT + c * WIDTH + tap, mask=c_ok, other=0.0).to(tl.float32)
        acc += xv * w_tap[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(OUT + rows.to(tl.int64)[:, None] * C + c[None, :], acc.to(OUT.dtype.element_ty),
             mask=r_ok[:, None] & c_ok[None, :])


def conv_sources_triton(x, weight, conv_pool, sources, windows: bool = True, config=(32, 128, 4)):
    """The tree conv (SiLU, no bias, unsplit ``[T, C]`` output) over a sources
    table; returns ``(out, compiled kernel)`` (its ``n_regs``, ``n_spills``)."""
    T, C = x.shape
    W = weight.shape[1]
    block_t, block_c, warps = config
    out = torch.empty(T, C, dtype=x.dtype, device=x.device)
    k = _conv_sources_kernel[(triton.cdiv(T, block_t), triton.cdiv(C, block_c))](
        x, weight.contiguous(), conv_pool, out, sources, T, C, x.stride(0),
        WIDTH=W, BLOCK_C=block_c, BLOCK_T=block_t, SILU=True, WINDOWS=windows, num_warps=warps)
    return out, k


@triton.jit
def _copy_tiles_kernel(X, OUT, T, C, stride_x, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < T)[:, None] & (c < C)[None, :]
    v = tl.load(X + rows.to(tl.int64)[:, None] * stride_x + c[None, :], mask=mask, other=0.0)
    tl.store(OUT + rows.to(tl.int64)[:, None] * C + c[None, :], v, mask=mask)


def copy_tiles_triton(x, config=(32, 128, 4)):
    """``x`` ``[T, C]`` (rows at any stride) copied to a dense tensor in the conv's tiles."""
    T, C = x.shape
    block_t, block_c, warps = config
    out = torch.empty(T, C, dtype=x.dtype, device=x.device)
    _copy_tiles_kernel[(triton.cdiv(T, block_t), triton.cdiv(C, block_c))](
        x, out, T, C, x.stride(0), BLOCK_C=block_c, BLOCK_T=block_t, num_warps=warps)
    return out
