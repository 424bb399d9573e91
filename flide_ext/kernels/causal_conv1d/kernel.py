"""Depthwise causal conv1d over varlen segments in Triton, each segment's initial
window read from a pool slot by index and its final window written to a slot.

Same signature and result as :func:`flide_ext.kernels.causal_conv1d.reference.causal_conv1d_ref`.
One program runs ``BLOCK_T`` rows of one segment for ``BLOCK_C`` channels;
taps that reach before the segment's first row read the parent's window in the
pool, so no per-question copy of the window is made.
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from ..arguments import check_written
from ..round_cache import round_cache

# Rows and channels of one program's tile.
BLOCK_T, BLOCK_C = 32, 128
# The whole-tree kernel's (rows, channels, warps) per program
# (benchmark/kernels/sweep_kernels.py --only conv).
TREE_CONFIG = (32, 128, 4)


@triton.jit
def _bias_activation(acc, BIAS, c, c_ok, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(BIAS + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    return acc


@triton.jit
def _causal_conv1d_kernel(
    X, WEIGHT, BIAS, POOL, OUT,
    BLOCKS, SEG_START, SEG_LEN, INITIAL, FINAL,
    C, stride_x, stride_out,
    WIDTH: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    # One program per (segment, BLOCK_T rows) entry of BLOCKS and BLOCK_C channels:
    # rows are independent given the inputs, so a long segment spreads over many
    # programs instead of one looping over it.
    seg = tl.load(BLOCKS + 2 * tl.program_id(0))
    t0 = tl.load(BLOCKS + 2 * tl.program_id(0) + 1)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    start = tl.load(SEG_START + seg)
    n = tl.load(SEG_LEN + seg)
    first = tl.load(INITIAL + seg)
    last = tl.load(FINAL + seg)
    HIST: tl.constexpr = WIDTH - 1
    taps = tl.arange(0, BLOCK_W)
    weight = tl.load(WEIGHT + c[:, None] * WIDTH + taps[None, :], mask=c_ok[:, None] & (taps[None, :] < WIDTH),
                     other=0.0).to(tl.float32)
    window = POOL + first.to(tl.int64) * C * HIST + c * HIST  # [BLOCK_C] row pointers of the initial window
    rows = t0 + tl.arange(0, BLOCK_T)
    row_ok = rows < n
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
    for tap in tl.static_range(WIDTH):
        src = rows - HIST + tap  # index in the segment; negative: the initial window
        in_x = row_ok & (src >= 0)
        xv = tl.load(X + (start + src).to(tl.int64)[:, None] * stride_x + c[None, :],
                     mask=in_x[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
        in_w = row_ok & (src < 0) & (first >= 0)
        wv = tl.load(window[None, :] + (HIST + src)[:, None], mask=in_w[:, None] & c_ok[None, :],
                     other=0.0).to(tl.float32)
        w_tap = tl.sum(tl.where(taps[None, :] == tap, weight, 0.0), axis=1)
        acc += (xv + wv) * w_tap[None, :]
    acc = _bias_activation(acc, BIAS, c, c_ok, HAS_BIAS, SILU)
    tl.store(OUT + (start + rows).to(tl.int64)[:, None] * stride_out + c[None, :], acc.to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & c_ok[None, :])
    # The segment's last block (an empty segment has one block) writes its final window.
    if (last >= 0) & (t0 + BLOCK_T >= n):
        # The last HIST inputs on the path: from the segment, or (short segment) from the initial window.
        hist = tl.arange(0, BLOCK_W)
        h_src = n - HIST + hist
        h_ok = hist < HIST
        h_in_x = h_ok & (h_src >= 0)
        h_xv = tl.load(X + (start + h_src).to(tl.int64)[:, None] * stride_x + c[None, :],
                       mask=h_in_x[:, None] & c_ok[None, :], other=0.0)
        h_in_w = h_ok & (h_src < 0) & (first >= 0)
        h_wv = tl.load(window[None, :] + (HIST + h_src)[:, None], mask=h_in_w[:, None] & c_ok[None, :], other=0.0)
        value = tl.where(h_in_x[:, None], h_xv.to(POOL.dtype.element_ty), h_wv.to(POOL.dtype.element_ty))
        tl.store(POOL + last.to(tl.int64) * C * HIST + c[None, :] * HIST + hist[:, None], value,
                 mask=h_ok[:, None] & c_ok[None, :])


def _inputs(x: torch.Tensor, weight: torch.Tensor, activation):
    # Rows must be dense for the kernels.
    T, C = x.shape
    return (x if x.stride(1) == 1 else x.contiguous()), T, C, weight.shape[1]


def _blocks(seg_len: torch.Tensor, block_t: int) -> torch.Tensor:
    # [nb, 2] int32 (segment, first row) of every BLOCK_T rows; an empty segment
    # gets one block, which only passes its window on.
    pairs = [(s, t0) for s, n in enumerate(seg_len.tolist()) for t0 in range(0, max(n, 1), block_t)]
    return torch.tensor(pairs, dtype=torch.int32, device=seg_len.device).reshape(-1, 2)


def row_blocks(seg_start, seg_len, initial_slot, final_slot, block_t: int = BLOCK_T):
    """``(blocks, seg_start, seg_len, initial_slot, final_slot)`` as the kernel
    reads them (int32), memoised for the round (:mod:`.round_cache`): built once,
    not per layer."""
    tensors = (seg_start, seg_len, initial_slot, final_slot)
    return round_cache.get(("conv_blocks", block_t), tensors,
                           lambda: (_blocks(seg_len, block_t),) + tuple(t.int() for t in tensors))


def causal_conv1d_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    conv_pool: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    initial_slot: torch.Tensor,
    final_slot: torch.Tensor,
    activation: Optional[str] = "silu",
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Triton causal conv1d; arguments, shapes and result as
    :func:`flide_ext.kernels.causal_conv1d.reference.causal_conv1d_ref` (float32 accumulation).

    A segment's initial and final slots must differ (a child reads its parent's slot).

    Raises:
        ValueError: ``out`` or ``conv_pool`` not contiguous.
    """
    x, T, C, W = _inputs(x, weight, activation)
    if out is None:
        out = x.new_zeros(x.shape)
    check_written(out=out, conv_pool=conv_pool)
    S = seg_start.numel()
    if S == 0:
        return out
    blocks, *table = row_blocks(seg_start, seg_len, initial_slot, final_slot)
    _causal_conv1d_kernel[(blocks.shape[0], triton.cdiv(C, BLOCK_C))](
        x, weight.contiguous(), bias.contiguous() if bias is not None else weight, conv_pool, out,
        blocks, *table, C, x.stride(0), out.stride(0),
        WIDTH=W, BLOCK_W=triton.next_power_of_2(W), BLOCK_C=BLOCK_C, BLOCK_T=BLOCK_T,
        HAS_BIAS=bias is not None, SILU=activation == "silu",
    )
    return out


@triton.jit
def _history_entry(HISTORY, seg, h, use, HIST: tl.constexpr):
    # Entry h (0 = oldest) of a segment's history table: a stream row (>= 0),
    # zero (-1) or a checkpoint window entry (-2 - entry); -1 where not ``use``.
    return tl.load(HISTORY + seg * HIST + h, mask=use, other=-1)


@triton.jit
def _window_value(POOL, slot, e, c, use, c_ok, C, HIST: tl.constexpr):
    # The checkpoint window's values of history entries ``e`` (zero where ``e``
    # names no window entry or not ``use``), float32.
    return tl.load(POOL + slot.to(tl.int64) * C * HIST + c[None, :] * HIST + (-2 - e)[:, None],
                   mask=(use & (e <= -2))[:, None] & c_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def _history_value(X, POOL, HISTORY, seg, slot, h, c, use, c_ok, stride_x, C, HIST: tl.constexpr):
    # Input h (0 = oldest) of a segment's history: a stream row, a checkpoint
    # window entry, or zero.
    e = _history_entry(HISTORY, seg, h, use, HIST)
    xv = tl.load(X + tl.maximum(e, 0).to(tl.int64)[:, None] * stride_x + c[None, :],
                 mask=(use & (e >= 0))[:, None] & c_ok[None, :], other=0.0)
    return xv.to(tl.float32) + _window_value(POOL, slot, e, c, use, c_ok, C, HIST)


@triton.jit
def _tree_taps(X, WEIGHT, POOL, HISTORY, rows, seg, idx, inside, slot, c, c_ok, stride_x, C,
               WIDTH: tl.constexpr, HEAD: tl.constexpr):
    # The conv's sum at stream rows ``rows`` (index ``idx`` in segment ``seg``),
    # float32, before bias and activation. A tap within the row's segment reads
    # its stream row. With HEAD a tap before it reads the segment's history
    # entry (a stream row, -1 for zero, -2 - e for entry e of the checkpoint
    # window in ``slot``); without, zero.
    HIST: tl.constexpr = WIDTH - 1
    acc = tl.zeros([rows.shape[0], c.shape[0]], tl.float32)
    for tap in tl.static_range(WIDTH):
        src = idx - HIST + tap
        s = tl.where(inside & (src >= 0), rows - HIST + tap, -1)
        if HEAD:
            before = inside & (src < 0)
            s = tl.where(before, _history_entry(HISTORY, seg, HIST + src, before, HIST).to(tl.int32), s)
        xv = tl.load(X + tl.maximum(s, 0).to(tl.int64)[:, None] * stride_x + c[None, :],
                     mask=(s >= 0)[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
        if HEAD:
            xv += _window_value(POOL, slot, s, c, inside, c_ok, C, HIST)
        w_tap = tl.load(WEIGHT + c * WIDTH + tap, mask=c_ok, other=0.0).to(tl.float32)
        acc += xv * w_tap[None, :]
    return acc


@triton.jit
def _store_rows(OUT, acc, rows, ok, c0, c, c_ok, T, C, stride_out, B1, B2, SPLIT: tl.constexpr):
    # With SPLIT the channel groups [0, B1), [B1, B2), [B2, C) are stored as
    # three contiguous [T, width] tensors one after another (a block of
    # channels, the first ``c0``, never straddles two: the wrapper splits so only then).
    if SPLIT:
        first = tl.where(c0 >= B2, B2, tl.where(c0 >= B1, B1, 0))
        width = tl.where(c0 >= B2, C - B2, tl.where(c0 >= B1, B2 - B1, B1))
        dest = OUT + first.to(tl.int64) * T + rows.to(tl.int64)[:, None] * width + (c - first)[None, :]
    else:
        dest = OUT + rows.to(tl.int64)[:, None] * stride_out + c[None, :]
    tl.store(dest, acc.to(OUT.dtype.element_ty), mask=ok[:, None] & c_ok[None, :])


@triton.jit
def _causal_conv1d_tree_kernel(
    X, WEIGHT, BIAS, OUT, TOKEN_SEG, SEG_START, SEG_LEN,
    T, C, stride_x, stride_out, B1, B2,
    WIDTH: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, SPLIT: tl.constexpr,
):
    # One program per BLOCK_T consecutive stream rows (of any segments) and
    # BLOCK_C channels, so the whole tree is one launch. Taps before a row's
    # segment read zero here: those rows (the first W-1 of each segment) are
    # computed again by _segment_edges_kernel. History and window lookups in
    # this kernel, masked or not, took registers and time from every tile
    # (benchmark/kernels/conv_variants.py).
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    r_ok = rows < T
    seg = tl.load(TOKEN_SEG + rows, mask=r_ok, other=0)
    idx = rows - tl.load(SEG_START + seg, mask=r_ok, other=0)
    inside = r_ok & (idx >= 0) & (idx < tl.load(SEG_LEN + seg, mask=r_ok, other=0))
    # No history: the pool, history and slot arguments go unused.
    acc = _tree_taps(X, WEIGHT, X, TOKEN_SEG, rows, seg, idx, inside, seg, c, c_ok, stride_x, C, WIDTH, False)
    acc = _bias_activation(acc, BIAS, c, c_ok, HAS_BIAS, SILU)
    acc = tl.where(inside[:, None], acc, 0.0)
    _store_rows(OUT, acc, rows, r_ok, tl.program_id(1) * BLOCK_C, c, c_ok, T, C, stride_out, B1, B2, SPLIT)


@triton.jit
def _segment_edges_kernel(
    X, WEIGHT, BIAS, POOL, OUT, SEG_START, SEG_LEN, HISTORY, HISTORY_SLOT, FINAL,
    T, C, stride_x, stride_out, B1, B2,
    WIDTH: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, SPLIT: tl.constexpr,
):
    # Per segment, after the tree kernel: its first W-1 rows again, their taps
    # before the segment reading its history (stream rows of its ancestors or a
    # checkpoint's window; the same terms in the same order as every other row);
    # then the last W-1 inputs on the path up to a kept segment's end, into its
    # final window.
    seg = tl.program_id(0)
    HIST: tl.constexpr = WIDTH - 1
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    start = tl.load(SEG_START + seg)
    n = tl.load(SEG_LEN + seg)
    slot = tl.load(HISTORY_SLOT + seg)
    h = tl.arange(0, BLOCK_W)
    h_ok = h < HIST
    head = h_ok & (h < n)
    acc = _tree_taps(X, WEIGHT, POOL, HISTORY, start + h, seg, h, head, slot, c, c_ok, stride_x, C, WIDTH, True)
    acc = _bias_activation(acc, BIAS, c, c_ok, HAS_BIAS, SILU)
    _store_rows(OUT, acc, start + h, head, tl.program_id(1) * BLOCK_C, c, c_ok, T, C, stride_out, B1, B2, SPLIT)
    last = tl.load(FINAL + seg)
    if last >= 0:
        src = n - HIST + h
        own = h_ok & (src >= 0)
        xv = tl.load(X + (start + src).to(tl.int64)[:, None] * stride_x + c[None, :],
                     mask=own[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
        hv = _history_value(X, POOL, HISTORY, seg, slot, HIST + src, c, h_ok & (src < 0), c_ok, stride_x, C, HIST)
        tl.store(POOL + last.to(tl.int64) * C * HIST + c[None, :] * HIST + h[:, None],
                 (xv + hv).to(POOL.dtype.element_ty), mask=h_ok[:, None] & c_ok[None, :])


def causal_conv1d_tree_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    conv_pool: torch.Tensor,
    token_segment: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    history: torch.Tensor,
    history_slot: torch.Tensor,
    final_slot: torch.Tensor,
    activation: Optional[str] = "silu",
    split: Optional[Sequence[int]] = None,
):
    """Triton causal conv1d over a whole prefix tree in one launch, plus one
    small launch with a program per segment that computes again its first W-1
    rows (whose taps reach its history) and writes the final windows of kept segments;
    arguments, shapes and result as
    :func:`flide_ext.kernels.causal_conv1d.reference.causal_conv1d_tree_ref`. No
    ``final_slot`` may be a slot the round reads (a ``history_slot``): the
    segments' programs run in no set order.
    Tables are read as given (int32 from :mod:`.tables` avoids conversions).
    The grid depends only on ``T``, ``C`` and ``S``, so the launch replays in a
    CUDA graph for any round of the same table shapes. With ``split`` the kernel
    stores each channel group contiguously itself (no copies) when every group
    boundary is a multiple of the tile's channels, else the groups are copied.

    Raises:
        ValueError: ``conv_pool`` not contiguous.
    """
    x, T, C, W = _inputs(x, weight, activation)
    check_written(conv_pool=conv_pool)
    block_t, block_c, warps = TREE_CONFIG
    edges = [0, *itertools.accumulate(split if split is not None else [C])]  # group boundaries, 0 ... C
    in_place = split is not None and all(b % block_c == 0 for b in edges[1:-1])
    b1, b2 = (edges[1:-1] + [C, C])[:2]
    buffer = torch.empty(T * C, dtype=x.dtype, device=x.device)
    out = buffer.view(T, C)
    if T > 0:
        tables = [t if t.is_contiguous() else t.contiguous()
                  for t in (token_segment, seg_start, seg_len, history, history_slot)]
        weight = weight.contiguous()
        common = (weight, bias.contiguous() if bias is not None else weight)
        flags = dict(HAS_BIAS=bias is not None, SILU=activation == "silu", SPLIT=in_place, WIDTH=W)
        _causal_conv1d_tree_kernel[(triton.cdiv(T, block_t), triton.cdiv(C, block_c))](
            x, *common, buffer, *tables[:3], T, C, x.stride(0), C, b1, b2,
            BLOCK_T=block_t, BLOCK_C=block_c, num_warps=warps, **flags,
        )
        if W > 1 and seg_start.numel():
            _segment_edges_kernel[(seg_start.numel(), triton.cdiv(C, block_c))](
                x, *common, conv_pool, buffer, *tables[1:], final_slot.contiguous(), T, C, x.stride(0), C, b1, b2,
                BLOCK_W=triton.next_power_of_2(W), BLOCK_C=block_c, **flags,
            )
    if split is None:
        return out
    if in_place:
        return tuple(buffer[T * a:T * b].view(T, b - a) for a, b in zip(edges, edges[1:]))
    return tuple(part.contiguous() for part in out.split(list(split), dim=1))
