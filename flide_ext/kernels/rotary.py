"""Rotary position embedding applied to query or key heads (Su et al., 2021,
"RoFormer", arXiv:2104.09864; half-split pairing as in Llama/Qwen checkpoints,
optionally on the first ``R`` features only: Qwen3.5's partial rotary). One
Triton launch on the GPU instead of the half split, negation, concatenations,
products and sum."""

from __future__ import annotations

import torch

from .arguments import float32_math_dtypes
from .dispatch import use_triton


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

    Raises:
        ValueError: shapes that do not match, or an odd ``R``.
    """
    _check(x, cos, sin)
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated_half = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos[:, None, :] + rotated_half * sin[:, None, :]
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


def _check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if x.dim() != 3:
        raise ValueError(f"rotary: x {tuple(x.shape)} must be [T, H, D]")
    T, _, D = x.shape
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != T:
        raise ValueError(f"rotary: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must both be [{T}, R]")
    R = cos.shape[1]
    if R % 2 or R > D:
        raise ValueError(f"rotary: R = {R} must be even and at most the head size {D}")
    if cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise ValueError(f"rotary: cos/sin dtype {cos.dtype}/{sin.dtype} is not x's {x.dtype}")


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`rotary_ref`'s contract; the Triton kernel (float32 math, the
    reference's roundings) on CUDA tensors of float32, bfloat16 or float16."""
    if use_triton(x) and float32_math_dtypes(x):
        from .rotary_triton import rotary_triton

        return rotary_triton(x, cos, sin)
    return rotary_ref(x, cos, sin)
