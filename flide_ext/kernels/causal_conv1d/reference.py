"""Depthwise causal conv1d over varlen segments, with each segment's initial
window read from a pool slot by index and its final window written to a slot.

A GDN layer runs its short causal convolution (kernel W, typically 4) over the
projected q/k/v channels. A child segment's first outputs need the last W-1
inputs before it on its root-to-leaf path: its parent's final window. Windows
are kept in ``conv_pool[slot]`` as ``[C, W-1]``, oldest first.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F



def causal_conv1d_ref(
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
    """Plain PyTorch reference, segment by segment.

    Args:
        x: ``[T, C]`` inputs of the flat stream.
        weight: ``[C, W]`` depthwise kernel (``conv1d.weight.squeeze(1)``).
        bias: ``[C]`` or None.
        conv_pool: ``[N, C, W-1]`` window pool, ``x.dtype``; written in place.
        seg_start, seg_len: ``[S]`` int64 rows of the segments to run (any subset of
            the stream, e.g. one tree level).
        initial_slot: ``[S]`` int64 slot holding each segment's initial window; -1
            for zeros (a root segment).
        final_slot: ``[S]`` int64 slot receiving the window after the segment's last
            token; -1 to skip.
        activation: ``"silu"`` or None.
        out: ``[T, C]`` tensor to write the segments' rows into (other rows are
            left as they are); a new zero tensor when None.

    Returns:
        ``out``: the given segments' rows filled (other rows zero if ``out`` was None).

    Arguments are checked by :func:`flide_ext.kernels.causal_conv1d.causal_conv1d`.
    """
    T, C = x.shape
    W = weight.shape[1]
    if out is None:
        out = torch.zeros_like(x)
    w = weight.unsqueeze(1)  # [C, 1, W]
    for start, n, first, last in zip(seg_start.tolist(), seg_len.tolist(), initial_slot.tolist(), final_slot.tolist()):
        window = conv_pool[first] if first >= 0 else x.new_zeros(C, W - 1)
        _segment(x, w, bias, activation, window.to(x.dtype), start, n, conv_pool, last, out)
    return out


def _segment(x, w, bias, activation, window, start: int, n: int, conv_pool, last: int, out) -> None:
    # One segment: its rows after its W-1 preceding inputs ``window`` [C, W-1];
    # outputs into ``out``, the last W-1 inputs into ``conv_pool[last]``.
    C, W = x.shape[1], w.shape[-1]
    seq = torch.cat([window, x[start : start + n].t()], dim=1)  # [C, W-1+n]
    if n:
        y = F.conv1d(seq.unsqueeze(0).to(w.dtype), w, bias, groups=C)[0]  # [C, n]
        if activation == "silu":
            y = F.silu(y)
        elif activation is not None:
            raise ValueError(f"activation {activation!r} is not supported")
        out[start : start + n] = y.t().to(x.dtype)
    if last >= 0:
        conv_pool[last] = seq[:, seq.shape[1] - (W - 1) :].to(conv_pool.dtype)


def causal_conv1d_tree_ref(
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
    """A whole prefix tree at once: each segment's first outputs read the inputs
    before it on its path from the stream itself (its history rows), so no level
    waits for another. Plain PyTorch reference, segment by segment.

    Args:
        x: ``[T, C]`` inputs of the flat stream.
        weight, bias, activation: as :func:`causal_conv1d_ref`.
        conv_pool: ``[N, C, W-1]`` window pool, ``x.dtype``: read for checkpoint
            windows, written for final windows.
        token_segment: ``[T]`` segment of each row (rows of a segment with no rows
            of its own, e.g. padding, get zeros).
        seg_start, seg_len: ``[S]`` stream rows of each segment.
        history: ``[S, W-1]`` the inputs before each segment's first row, oldest
            first: a stream row (>= 0), zero (-1), or ``-2 - h``: entry ``h`` of the
            window in ``conv_pool[history_slot]``
            (:func:`flide_ext.kernels.tables.conv_history`).
        history_slot: ``[S]`` the checkpoint slot those entries read (-1: none).
        final_slot: ``[S]`` slot receiving the window after the segment's last
            row (-1: skip).
        split: up to three channel counts summing to ``C`` (a GDN layer's q, k
            and v): the outputs as that many contiguous tensors instead of one.

    Returns:
        ``[T, C]`` outputs (zeros on rows of no segment), or with ``split`` a
        tuple of ``[T, split[i]]`` contiguous tensors.

    Arguments are checked by :func:`flide_ext.kernels.causal_conv1d.causal_conv1d_tree`.
    """
    C = x.shape[1]
    out = torch.zeros_like(x)
    w = weight.unsqueeze(1)
    rows = zip(seg_start.tolist(), seg_len.tolist(), history.tolist(), history_slot.tolist(), final_slot.tolist())
    for start, n, hist, slot, last in rows:
        before = [x[e] if e >= 0 else conv_pool[slot][:, -2 - e].to(x.dtype) if e <= -2 else x.new_zeros(C)
                  for e in hist]
        window = torch.stack(before, dim=1) if before else x.new_zeros(C, 0)
        _segment(x, w, bias, activation, window, start, n, conv_pool, last, out)
    if split is not None:
        return tuple(part.contiguous() for part in out.split(list(split), dim=1))
    return out
