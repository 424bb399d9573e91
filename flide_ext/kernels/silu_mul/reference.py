"""SwiGLU's gating product ``silu(gate) * up`` (Shazeer, 2020, "GLU Variants
Improve Transformer"; SiLU: Elfwing, Uchibe & Doya, 2018): the middle of a gated
MLP, one Triton launch on the GPU instead of two element-wise ones, reading the
gate and up halves of one stacked projection in place."""

from __future__ import annotations

import torch



def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch reference, rounded as ``F.silu(gate) * up`` is (the SiLU
    rounded to the input dtype, then the product), but computed in float64: CPU
    vector math takes a scalar path for a tensor's tail elements, so a float32
    SiLU could differ by an ulp with the round's size; rounded float64 does not.

    Args:
        gate, up: ``[T, I]`` of one float dtype, any strides.

    Returns:
        ``[T, I]`` contiguous, in the inputs' dtype.

    Arguments are checked by :func:`flide_ext.kernels.silu_mul.silu_mul`.
    """
    g = gate.double()
    s = (g * torch.sigmoid(g)).to(gate.dtype).double()
    return (s * up.double()).to(gate.dtype).contiguous()
