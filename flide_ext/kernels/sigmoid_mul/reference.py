"""Gated attention's output gate ``x * sigmoid(gate)`` per head (Qiu et al., 2025,
"Gated Attention for Large Language Models", arXiv:2505.06708; the Qwen3.5 /
Qwen3-Next attention output): one Triton launch on the GPU instead of a copy of
the gate out of the query projection and two element-wise ones."""

from __future__ import annotations

import torch


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
    s = torch.sigmoid(gate.double()).to(gate.dtype).double()
    return (x.double() * s).to(x.dtype).reshape(x.shape[0], -1).contiguous()
