"""Self-attention of a flat stream with the fork visibility rule: GQA, RoPE at
logical positions (full or partial rotary), optional per-head q/k RMSNorm (Qwen3,
Qwen3.5) and optional sigmoid output gate (Qwen3.5 / Qwen3-Next gated attention:
``q_proj`` emits each head's query and gate side by side)."""

from __future__ import annotations

from typing import Optional, Type

import torch
from torch import nn

from ..kernels.fork_attention import fork_attention
from ..kernels.rotary import rotary
from ..kernels.sigmoid_mul import sigmoid_mul
from .kernel_module import KernelModule
from .linear import Linear
from .norm import RMSNorm


class ForkSelfAttention(KernelModule):
    """Projections named as in Hugging Face checkpoints (``q_proj``, ``k_proj``,
    ``v_proj``, ``o_proj``, optional ``q_norm``/``k_norm``).

    Args:
        index: this layer's rank among the model's attention layers (selects its
            rows of the K/V pool).
        gated: ``q_proj`` emits ``[query | gate]`` per head; the output is
            ``o_proj(attn * sigmoid(gate))``.
        qk_norm: norm class applied per head to q and k before RoPE, or None.
        sliding_window: keys at most this many positions back, the query's own
            included (``q_pos - k_pos < window``); None: all.
        scale: the softmax scale (None: ``head_dim ** -0.5``).
        rope: which of the forward's rotary tables this layer rotates by
            (:attr:`~flide_ext.layers.context.ForwardContext.rope`; ``""``: the model's one).
    """

    #: False for a layer that reads another layer's K/V (Gemma 4's KV sharing):
    #: it has no rows in the K/V pool, and ``index`` is its source's.
    owns_kv = True

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        index: int = 0,
        bias: bool = False,
        qk_norm: Optional[Type[nn.Module]] = None,
        norm_eps: float = 1e-6,
        gated: bool = False,
        sliding_window: Optional[int] = None,
        scale: Optional[float] = None,
        rope: str = "",
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.index, self.gated = index, gated
        self.q_proj = Linear(hidden_size, num_heads * head_dim * (2 if gated else 1), bias=bias)
        self.k_proj = Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = Linear(num_heads * head_dim, hidden_size, bias=bias)
        if qk_norm is not None:
            self.q_norm = qk_norm(head_dim, norm_eps)
            self.k_norm = qk_norm(head_dim, norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.scale = head_dim**-0.5 if scale is None else scale
        self.sliding_window, self.rope = sliding_window, rope

    def forward(self, x: torch.Tensor, ctx) -> torch.Tensor:
        """``x`` ``[T, hidden]`` -> ``[T, hidden]``; ``ctx`` is the ForwardContext."""
        T = x.shape[0]
        if self.gated:
            # The gate stays a strided view: the fused gate kernel reads it in place.
            q, gate = self.q_proj(x).view(T, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        else:
            q = self.q_proj(x).view(T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = ctx.rope[self.rope]
        q, k = rotary(q, cos, sin, self.backend), rotary(k, cos, sin, self.backend)
        o = self.attend(q, k, v, ctx)
        o = sigmoid_mul(o, gate, self.backend) if self.gated else o.reshape(T, -1)
        return self.o_proj(o)

    def attend(self, q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], ctx) -> torch.Tensor:
        """ForkAttention of the stream's queries over their keys.

        Args:
            q: ``[T, Hq, D]`` rotated queries.
            k, v: ``[T, Hkv, D]`` this layer's rotated keys and values, which
                join the K/V pool's rows of attention layer ``self.index`` when
                the forward has a pool. None (a KV-shared layer, whose ``index``
                is its source's): read the K/V that layer wrote in this forward,
                its pool rows, or without a pool what it left in ``ctx.layer_kv``.

        Returns:
            ``[T, Hq, D]`` in ``q.dtype``.
        """
        plan = ctx.plan
        kv_index = None
        if ctx.kv_pool is not None and plan.kv_index is not None:
            # The stream's K/V join the pool's rows; every key, cached or new, is
            # read there in place.
            pool_k, pool_v = ctx.kv_pool.k[self.index], ctx.kv_pool.v[self.index]
            if k is not None:
                pool_k.index_copy_(0, plan.stream_rows, k)
                pool_v.index_copy_(0, plan.stream_rows, v)
            k, v, kv_index = pool_k, pool_v, plan.kv_index
        elif k is None:
            k, v = ctx.layer_kv[self.index]
        return fork_attention(
            q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
            plan.positions, plan.kv_positions, self.scale, self.sliding_window,
            tables=plan.tables.attention if plan.tables is not None else None, kv_index=kv_index,
            backend=self.backend,
        )
