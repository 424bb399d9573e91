"""RMSNorm (Zhang & Sennrich, 2019, "Root Mean Square Layer Normalization")."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..kernels.rms_norm import rms_norm
from .kernel_module import KernelModule


class RMSNorm(KernelModule):
    """``y = w * (x / sqrt(mean(x^2) + eps))``, normalised in float32 and cast back
    to the input dtype before the weight, as Llama and Qwen3 checkpoints expect.

    Input ``[..., hidden]`` of any float dtype; output the same shape and dtype.
    Given ``residual`` (like ``x``, in its dtype or float32), normalises ``x +
    residual`` in the same launch and returns ``(normalised, x + residual)``, the
    sum in the residual's dtype.
    """

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        return rms_norm(x, self.weight, self.eps, "cast", residual=residual, backend=self.backend)


class ZeroCenteredRMSNorm(KernelModule):
    """``y = (x / sqrt(mean(x^2) + eps)) * (1 + w)`` in float32, cast to the input
    dtype at the end (Qwen3.5 / Qwen3-Next; weights stored as offsets from 1).

    Input ``[..., hidden]``; output the same shape and dtype. Given ``residual``
    (like ``x``, in its dtype or float32), normalises ``x + residual`` in the same
    launch and returns ``(normalised, x + residual)``, the sum in the residual's dtype.
    """

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        return rms_norm(x, self.weight, self.eps, "offset", residual=residual, backend=self.backend)


class GatedRMSNorm(KernelModule):
    """``y = w * rmsnorm(x) * silu(z)``: the GDN output norm, applied per value head
    (Qwen3.5 / Qwen3-Next ``linear_attn.norm``).

    Inputs ``x``, ``z`` ``[..., head_dim]``; output like ``x``. Given ``valid``
    (``[x.shape[0]]`` bool), the rows of entries where it is False come out zero
    in the same launch.
    """

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, "cast", gate=z, valid=valid, backend=self.backend)


class WeightedRMSNorm(KernelModule):
    """``y = (x / sqrt(mean(x^2) + eps)) * w`` in float32, cast to the input dtype
    at the end (Gemma 4: weights stored as the scale itself). Without a weight
    (``with_weight=False``: Gemma 4's value and router norms) ``w`` is 1.

    Input ``[..., hidden]``; output the same shape and dtype. Given ``residual``
    (like ``x``, in its dtype or float32), normalises ``x + residual`` in the same
    launch and returns ``(normalised, x + residual)``, the sum in the residual's dtype.
    """

    def __init__(self, hidden_size: int, eps: float, with_weight: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size)) if with_weight else None
        self.hidden_size, self.eps = hidden_size, eps
        self._ones: Optional[torch.Tensor] = None  # the weight-free norm's 1s, made on first use on its device

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        weight = self.weight
        if weight is None:
            if self._ones is None or self._ones.device != x.device:
                self._ones = torch.ones(self.hidden_size, dtype=torch.float32, device=x.device)
            weight = self._ones
        return rms_norm(x, weight, self.eps, "scale", residual=residual, backend=self.backend)
