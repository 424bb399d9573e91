"""Sparse mixture-of-experts block with a shared expert (Qwen3-Next): a softmax
router picks the top-k experts per token; their SwiGLU outputs are mixed by the
(renormalised) router weights, plus a sigmoid-gated shared expert.

A plain per-expert reference: tokens are gathered per expert, no fused kernel.
"""

from __future__ import annotations

import torch
from torch import nn

from .linear import Linear
from .mlp import GatedMLP


def mix_experts(experts: nn.ModuleList, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_k weights[t, k] * experts[chosen[t, k]](x[t])``; ``x`` ``[T, H]``,
    ``chosen``/``weights`` ``[T, k]`` -> ``[T, H]``. Each expert runs once on its rows."""
    out = torch.zeros_like(x)
    for e in torch.unique(chosen).tolist():
        rows, rank = torch.nonzero(chosen == e, as_tuple=True)
        y = experts[e](x[rows])
        out.index_add_(0, rows, (y * weights[rows, rank, None]).to(out.dtype))
    return out


class SparseMoeBlock(nn.Module):
    """Router ``gate`` ``[E, H]``, ``experts``, ``shared_expert`` and
    ``shared_expert_gate``; ``x`` ``[T, H]`` -> ``[T, H]``."""

    def __init__(self, config):
        super().__init__()
        H = config.hidden_size
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = Linear(H, config.num_experts, bias=False)
        # Per-expert SwiGLU MLPs, named as stored in checkpoints (experts.{e}.gate_proj ...).
        self.experts = nn.ModuleList(
            GatedMLP(H, config.moe_intermediate_size, config.hidden_act) for _ in range(config.num_experts)
        )
        self.shared_expert = GatedMLP(H, config.shared_expert_intermediate_size, config.hidden_act)
        self.shared_expert_gate = Linear(H, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Router math on these narrow [T, E] tensors runs in float64 and is rounded
        # once, so a row's weights do not depend on the round's size (CPU vector math
        # treats a tensor's tail elements differently).
        probs = torch.softmax(self.gate(x).double(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        routed = mix_experts(self.experts, x, experts, weights.to(x.dtype))
        shared_gate = torch.sigmoid(self.shared_expert_gate(x).double()).to(x.dtype)
        return routed + shared_gate * self.shared_expert(x)
