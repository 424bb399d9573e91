"""Depthwise causal conv1d over varlen segments, with each segment's initial
window read from a pool slot by index and its final window written to a slot.

A GDN layer runs its short causal convolution (kernel W, typically 4) over the
projected q/k/v channels. A child segment's first outputs need the last W-1
inputs before it on its root-to-leaf path: its parent's final window. Windows
are kept in ``conv_pool[slot]`` as ``[C, W-1]``, oldest first.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .dispatch import use_triton


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

    Raises:
        ValueError: an unsupported activation.
    """
    T, C = x.shape
    W = weight.shape[1]
    if out is None:
        out = torch.zeros_like(x)
    w = weight.unsqueeze(1)  # [C, 1, W]
    for start, n, first, last in zip(seg_start.tolist(), seg_len.tolist(), initial_slot.tolist(), final_slot.tolist()):
        window = conv_pool[first] if first >= 0 else x.new_zeros(C, W - 1)
        seq = torch.cat([window.to(x.dtype), x[start : start + n].t()], dim=1)  # [C, W-1+n]
        if n:
            y = F.conv1d(seq.unsqueeze(0).to(weight.dtype), w, bias, groups=C)[0]  # [C, n]
            if activation == "silu":
                y = F.silu(y)
            elif activation is not None:
                raise ValueError(f"activation {activation!r} is not supported")
            out[start : start + n] = y.t().to(x.dtype)
        if last >= 0:
            conv_pool[last] = seq[:, seq.shape[1] - (W - 1) :].to(conv_pool.dtype)
    return out


def causal_conv1d(*args, **kwargs) -> torch.Tensor:
    """Dispatch; same signature as :func:`causal_conv1d_ref`: the Triton kernel
    (:mod:`.causal_conv1d_triton`) on CUDA, the reference elsewhere or when
    :mod:`.dispatch` forces it."""
    x = args[0] if args else kwargs["x"]
    if use_triton(x):
        from .causal_conv1d_triton import causal_conv1d_triton

        return causal_conv1d_triton(*args, **kwargs)
    return causal_conv1d_ref(*args, **kwargs)
