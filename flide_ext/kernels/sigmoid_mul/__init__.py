"""Gated attention's ``x * sigmoid(gate)``: the public function (argument checks
and dispatch); reference in :mod:`.reference`, kernel in :mod:`.kernel`."""

from __future__ import annotations

from typing import Optional

import torch

from ..arguments import float32_math_dtypes
from ..dispatch import backend_for, checked_reference
from . import reference

__all__ = ["MAX_TRITON_WIDTH", "sigmoid_mul", "sigmoid_mul_ref"]

MAX_TRITON_WIDTH = 16384  # elements of one head the kernel holds at once


def _check(x: torch.Tensor, gate: torch.Tensor) -> None:
    if x.dim() != 3 or gate.shape != x.shape:
        raise ValueError(f"sigmoid_mul: x {tuple(x.shape)} and gate {tuple(gate.shape)} must both be [T, H, D]")
    if gate.dtype != x.dtype:
        raise ValueError(f"sigmoid_mul: x dtype {x.dtype} and gate dtype {gate.dtype} differ")
    if not x.is_floating_point():
        raise ValueError(f"sigmoid_mul: x dtype {x.dtype} is not a floating-point dtype")


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor, backend: Optional[str] = None) -> torch.Tensor:
    """:func:`~.reference.sigmoid_mul_ref`'s contract; with ``backend`` ``"triton"``
    (or None on CUDA) the Triton kernel (float32 math) for float32, bfloat16 or
    float16 inputs at most ``MAX_TRITON_WIDTH`` wide per head (float64 and wider
    heads, wider than any supported model's, take the reference).

    Raises:
        ValueError: ``x`` and ``gate`` not both ``[T, H, D]`` of one floating dtype.
    """
    _check(x, gate)
    if backend_for(x, backend) == "triton" and x.shape[-1] <= MAX_TRITON_WIDTH and float32_math_dtypes(x, gate):
        from .kernel import sigmoid_mul_triton

        return sigmoid_mul_triton(x, gate)
    return reference.sigmoid_mul_ref(x, gate)


sigmoid_mul_ref = checked_reference(sigmoid_mul, reference.sigmoid_mul_ref)
