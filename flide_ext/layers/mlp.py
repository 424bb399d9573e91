"""Gated feed-forward block (Shazeer, 2020, "GLU Variants Improve Transformer")."""

from __future__ import annotations

import torch
from transformers.activations import ACT2FN

from ..kernels.silu_mul import silu_mul
from .kernel_module import KernelModule
from .linear import Linear, StackedLinear


def act_mul(act, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``act(gate) * up`` (``[T, I]`` each), rounded as those two torch operations
    round it; on the CPU computed in float64 and rounded, because CPU vector math
    takes a scalar path for a tensor's tail elements, so a float32 activation
    could differ by an ulp with the round's size (as :func:`~flide_ext.kernels.silu_mul.silu_mul_ref`)."""
    if gate.device.type == "cpu" and gate.dtype != torch.float64:
        a = act(gate.double()).to(gate.dtype)
        return (a.double() * up.double()).to(gate.dtype)
    return act(gate) * up


class GatedMLP(KernelModule):
    """``down(act(gate(x)) * up(x))``; ``x`` ``[T, hidden]`` -> ``[T, hidden]``.

    ``gate_proj`` and ``up_proj`` run as one GEMM; with SiLU (every supported
    checkpoint) the gating product is one fused kernel (:mod:`flide_ext.kernels.silu_mul`).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, bias: bool = False):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)
        self.act_name = act
        self.act = ACT2FN[act]
        self.gate_up = StackedLinear(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x)
        if self.act_name == "silu":
            return self.down_proj(silu_mul(gate, up, self.backend))
        return self.down_proj(act_mul(self.act, gate, up))
