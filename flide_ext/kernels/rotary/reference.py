"""Rotary position embedding applied to query or key heads (Su et al., 2021,
"RoFormer", arXiv:2104.09864; half-split pairing as in Llama/Qwen checkpoints,
optionally on the first ``R`` features only: Qwen3.5's partial rotary). One
Triton launch on the GPU instead of the half split, negation, concatenations,
products and sum."""

from __future__ import annotations

import torch



def rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch reference: rotate ``x``'s first ``R`` features per head.

    Each product and the sum are rounded to ``x.dtype`` as torch's element-wise
    operations round them (exact IEEE results in float32).

    Args:
        x: ``[T, H, D]`` query or key heads (any strides).
        cos, sin: ``[T, R]`` in ``x.dtype`` (``R`` even, at most ``D``), the
            per-token tables of :class:`flide_ext.layers.rotary.RotaryEmbedding`.

    Returns:
        ``[T, H, D]`` in ``x.dtype``: features ``[0, R)`` rotated, the rest as given.

    Arguments are checked by :func:`flide_ext.kernels.rotary.rotary`.
    """
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated_half = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos[:, None, :] + rotated_half * sin[:, None, :]
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out
