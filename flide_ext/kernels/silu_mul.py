"""SwiGLU's gating product ``silu(gate) * up`` (Shazeer, 2020, "GLU Variants
Improve Transformer"; SiLU: Elfwing, Uchibe & Doya, 2018): the middle of a gated
MLP, one Triton launch on the GPU instead of two element-wise ones, reading the
gate and up halves of one stacked projection in place."""

from __future__ import annotations

import torch

from .arguments import float32_math_dtypes
from .dispatch import use_triton


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch reference, rounded as ``F.silu(gate) * up`` is (the SiLU
    rounded to the input dtype, then the product), but computed in float64: CPU
    vector math takes a scalar path for a tensor's tail elements, so a float32
    SiLU could differ by an ulp with the round's size; rounded float64 does not.

    Args:
        gate, up: ``[T, I]`` of one float dtype, any strides.

    Returns:
        ``[T, I]`` contiguous, in the inputs' dtype.

    Raises:
        ValueError: shapes or dtypes that differ, not 2-D, or not floating point.
    """
    _check(gate, up)
    g = gate.double()
    s = (g * torch.sigmoid(g)).to(gate.dtype).double()
    return (s * up.double()).to(gate.dtype).contiguous()


def _check(gate: torch.Tensor, up: torch.Tensor) -> None:
    if gate.dim() != 2 or gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} must both be [T, I]")
    if gate.dtype != up.dtype:
        raise ValueError(f"silu_mul: gate dtype {gate.dtype} and up dtype {up.dtype} differ")
    if not gate.is_floating_point():
        raise ValueError(f"silu_mul: gate dtype {gate.dtype} is not a floating-point dtype")


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:func:`silu_mul_ref`'s contract; the Triton kernel (float32 math) on CUDA
    tensors of float32, bfloat16 or float16 (float64 takes the reference)."""
    if use_triton(gate) and float32_math_dtypes(gate, up):
        from .silu_mul_triton import silu_mul_triton

        return silu_mul_triton(gate, up)
    return silu_mul_ref(gate, up)
