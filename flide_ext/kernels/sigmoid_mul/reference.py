"""Gated attention's output gate ``x * sigmoid(gate)`` per head (Qiu et al., 2025,
"Gated Attention for Large Language Models", arXiv:2505.06708; the Qwen3.5 /
Qwen3-Next attention output): one Triton launch on the GPU instead of a copy of
the gate out of the query projection and two element-wise ones."""

from __future__ import annotations

import math

import torch

# ln of float32's largest finite value: exp of anything larger overflows to inf.
FLOAT32_EXP_LIMIT = math.log(torch.finfo(torch.float32).max)


def sigmoid_mul_ref(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch reference, rounded as ``x * torch.sigmoid(gate)`` is (the
    sigmoid rounded to the input dtype, then the product), computed in float64
    (as :func:`flide_ext.kernels.silu_mul.reference.silu_mul_ref`, for the same reason).

    Args:
        x: ``[T, H, D]`` the attention output per head (any strides).
        gate: ``[T, H, D]`` its gate, in ``x.dtype`` (any strides: the gate
            halves of the query projection's rows).

    Returns:
        ``[T, H * D]`` contiguous, in ``x.dtype``: the heads side by side, as
        the output projection reads them.

    Arguments are checked by :func:`flide_ext.kernels.sigmoid_mul.sigmoid_mul`.
    """
    g = gate.double()
    # float32 math (torch's, the kernel's) computes 1 / (1 + exp(-g)): exp overflows
    # below -ln(FLT_MAX) and the sigmoid is 0 there, where float64's is a subnormal.
    s = torch.where(g < -FLOAT32_EXP_LIMIT, 0.0, torch.sigmoid(g)).to(gate.dtype).double()
    T, H, D = x.shape
    return (x.double() * s).to(x.dtype).reshape(T, H * D).contiguous()
