"""RMSNorm (Zhang & Sennrich, 2019, "Root Mean Square Layer Normalization")."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``y = w * (x / sqrt(mean(x^2) + eps))``, normalised in float32 and cast back
    to the input dtype before the weight, as Llama and Qwen3 checkpoints expect.

    Input ``[..., hidden]`` of any float dtype; output the same shape and dtype.
    """

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)
