"""Self-attention of a flat stream with the fork visibility rule (GQA, RoPE at
logical positions, optional per-head q/k RMSNorm as in Qwen3)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .linear import Linear

from ..kernels import fork_attention
from .norm import RMSNorm
from .rotary import apply_rotary


class ForkSelfAttention(nn.Module):
    """Projections named as in Hugging Face Llama/Qwen3 checkpoints
    (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, optional ``q_norm``/``k_norm``)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        bias: bool = False,
        qk_norm_eps: Optional[float] = None,
        sliding_window: Optional[int] = None,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = Linear(num_heads * head_dim, hidden_size, bias=bias)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.scale = head_dim**-0.5
        self.sliding_window = sliding_window

    def forward(self, x: torch.Tensor, plan, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x`` ``[T, hidden]`` -> ``[T, hidden]``; ``plan`` is the round's FlatPlan."""
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = fork_attention(
            q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len, plan.positions,
            self.scale, self.sliding_window,
        )
        return self.o_proj(o.reshape(T, -1))
