"""Gated feed-forward block (Shazeer, 2020, "GLU Variants Improve Transformer")."""

from __future__ import annotations

import torch
from torch import nn

from .linear import Linear
from transformers.activations import ACT2FN


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``; ``x`` ``[T, hidden]`` -> ``[T, hidden]``."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, bias: bool = False):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)
        self.act = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
