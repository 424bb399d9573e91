"""The Gated DeltaNet gates of Qwen3.5 / Qwen3-Next (model cards; Yang, Kautz &
Hatamizadeh, 2024, arXiv:2412.06464): write strength ``beta = sigmoid(b)`` and log
decay ``g = -exp(A_log) * softplus(a + dt_bias)``, per token and value head; one
Triton launch on the GPU instead of a dozen element-wise ones."""

from __future__ import annotations

import torch
import torch.nn.functional as F



def gdn_gate_ref(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """Plain PyTorch reference, in float64 and then rounded: CPU vector math takes a
    scalar path for a tensor's tail elements, so float32 gates could differ by an
    ulp with the round's size; rounded float64 values do not.

    Args:
        a, b: ``[T, HV]`` projections (any float dtype, any strides).
        A_log, dt_bias: ``[HV]``.

    Returns:
        ``(g, beta)``: ``g`` ``[T, HV]`` float32 (<= 0), ``beta`` ``[T, HV]`` in ``b.dtype``.

    Arguments are checked by :func:`flide_ext.kernels.gdn_gate.gdn_gate`.
    """
    beta = torch.sigmoid(b.double()).to(b.dtype)
    g = (-A_log.double().exp() * F.softplus(a.double() + dt_bias.double())).float()
    return g, beta
