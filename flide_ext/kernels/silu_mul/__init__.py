"""SwiGLU's ``silu(gate) * up``: the public function (argument checks and
dispatch); reference in :mod:`.reference`, kernel in :mod:`.kernel`."""

from __future__ import annotations

from typing import Optional

import torch

from ..arguments import float32_math_dtypes
from ..dispatch import backend_for, checked_reference
from . import reference

__all__ = ["silu_mul", "silu_mul_ref"]


def _check(gate: torch.Tensor, up: torch.Tensor) -> None:
    if gate.dim() != 2 or gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} must both be [T, I]")
    if gate.dtype != up.dtype:
        raise ValueError(f"silu_mul: gate dtype {gate.dtype} and up dtype {up.dtype} differ")
    if not gate.is_floating_point():
        raise ValueError(f"silu_mul: gate dtype {gate.dtype} is not a floating-point dtype")


def silu_mul(gate: torch.Tensor, up: torch.Tensor, backend: Optional[str] = None) -> torch.Tensor:
    """:func:`~.reference.silu_mul_ref`'s contract; with ``backend`` ``"triton"`` (or
    None on CUDA) the Triton kernel (float32 math) for float32, bfloat16 or float16
    inputs (float64 takes the reference).

    Raises:
        ValueError: ``gate`` and ``up`` not both ``[T, I]`` of one floating dtype.
    """
    _check(gate, up)
    if backend_for(gate, backend) == "triton" and float32_math_dtypes(gate, up):
        from .kernel import silu_mul_triton

        return silu_mul_triton(gate, up)
    return reference.silu_mul_ref(gate, up)


silu_mul_ref = checked_reference(silu_mul, reference.silu_mul_ref)
