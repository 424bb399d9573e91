"""Rotary position embedding on query or key heads: the public function
(argument checks and dispatch); reference in :mod:`.reference`, kernel in :mod:`.kernel`."""

from __future__ import annotations

from typing import Optional

import torch

from ..arguments import float32_math_dtypes
from ..dispatch import backend_for, checked_reference
from . import reference

__all__ = ["rotary", "rotary_ref"]


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


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: Optional[str] = None) -> torch.Tensor:
    """:func:`~.reference.rotary_ref`'s contract; with ``backend`` ``"triton"`` (or
    None on CUDA) the Triton kernel (float32 math, the reference's roundings) for
    float32, bfloat16 or float16 inputs.

    Raises:
        ValueError: ``x`` not ``[T, H, D]``; ``cos``/``sin`` not ``[T, R]`` with an
            even ``R <= D`` in ``x``'s dtype.
    """
    _check(x, cos, sin)
    if backend_for(x, backend) == "triton" and float32_math_dtypes(x):
        from .kernel import rotary_triton

        return rotary_triton(x, cos, sin)
    return reference.rotary_ref(x, cos, sin)


rotary_ref = checked_reference(rotary, reference.rotary_ref)
