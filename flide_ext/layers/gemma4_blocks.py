"""Gemma 4's attention and mixture-of-experts blocks over a flat stream
(transformers 5.19, ``models/gemma4``; Gemma 4 model card).

Attention: per-head weighted RMSNorm on queries and keys, a weight-free RMSNorm
on values, softmax scale 1, RoPE per layer type, a sliding window on sliding
layers; full layers may take their values from the key projection (``K = V``:
the raw projection, before the key norm and RoPE), and the last layers may read
the keys and values of the last earlier layer of their type (KV sharing).

Mixture of experts (every layer of a MoE checkpoint, beside the dense MLP): a
softmax router over a weight-free RMSNorm of the block's input, top-k,
renormalised, scaled per expert; GELU-gated experts stored as packed 3-D weights.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from ..kernels.rotary import rotary
from .attention import ForkSelfAttention
from .linear import Linear, linear
from .mlp import act_mul
from .norm import WeightedRMSNorm


class Gemma4Attention(ForkSelfAttention):
    """One Gemma 4 attention layer, named as in the checkpoints (``q_proj``,
    ``k_proj``, ``v_proj``, ``o_proj``, ``q_norm``, ``k_norm``).

    Args:
        config: the text config (``per_layer_config`` gives the layer's head size
            and K/V head count).
        layer: the layer's index in the model.
        index: its rank among the layers that own K/V rows; for a KV-shared
            layer the rank of the layer it reads.
        shared: True for a KV-shared layer (no K/V projections or norms).
        lends: True for the layer whose K/V shared layers read.
    """

    def __init__(self, config, layer: int, index: int, shared: bool, lends: bool):
        layer_type = config.layer_types[layer]
        sliding = layer_type == "sliding_attention"
        layer_config = config.per_layer_config[layer]
        super().__init__(
            config.hidden_size, config.num_attention_heads, layer_config.num_key_value_heads, layer_config.head_dim,
            index=index, bias=config.attention_bias, qk_norm=WeightedRMSNorm, norm_eps=config.rms_norm_eps,
            sliding_window=config.sliding_window if sliding else None, scale=1.0, rope=layer_type,
        )
        self.owns_kv, self.lends = not shared, lends
        self.values_from_keys = config.attention_k_eq_v and not sliding
        if shared:
            del self.k_proj, self.v_proj, self.k_norm
            self.k_proj = self.v_proj = self.k_norm = None
        elif self.values_from_keys:
            del self.v_proj
            self.v_proj = None
        self.v_norm = WeightedRMSNorm(self.head_dim, config.rms_norm_eps, with_weight=False)

    def forward(self, x: torch.Tensor, ctx) -> torch.Tensor:
        """``x`` ``[T, hidden]`` -> ``[T, hidden]``; ``ctx`` is the ForwardContext."""
        T = x.shape[0]
        cos, sin = ctx.rope[self.rope]
        q = rotary(self.q_norm(self.q_proj(x).view(T, self.num_heads, self.head_dim)), cos, sin, self.backend)
        if not self.owns_kv:
            o = self.attend(q, None, None, ctx)
        else:
            k_raw = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)
            v_raw = k_raw if self.values_from_keys else self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
            k = rotary(self.k_norm(k_raw), cos, sin, self.backend)
            v = self.v_norm(v_raw)
            if self.lends:
                ctx.layer_kv[self.index] = (k, v)
            o = self.attend(q, k, v, ctx)
        return self.o_proj(o.reshape(T, -1))


class Gemma4Router(nn.Module):
    """``proj`` ``[E, H]``, ``scale`` ``[H]``, ``per_expert_scale`` ``[E]``.

    ``x`` ``[T, H]`` (the residual stream, any float dtype) -> ``(weights [T, k]
    in the weights' dtype, experts [T, k] int64)``:
    softmax over the experts of ``proj(rms(x) * scale / sqrt(H))``, the top k
    renormalised to sum 1, each times its expert's scale.
    """

    def __init__(self, config):
        super().__init__()
        H = config.hidden_size
        self.top_k, self.root = config.top_k_experts, H**-0.5
        self.norm = WeightedRMSNorm(H, config.rms_norm_eps, with_weight=False)
        self.proj = Linear(H, config.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(H))
        self.per_expert_scale = nn.Parameter(torch.ones(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = (self.norm(x) * self.scale * self.root).to(self.proj.weight.dtype)
        # The narrow [T, E] router math runs in float64 and is rounded once, so a
        # row's weights do not depend on how many rows share the round.
        probs = torch.softmax(self.proj(u).double(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights * self.per_expert_scale.double()[experts]
        return weights.to(self.proj.weight.dtype), experts


class Gemma4Experts(nn.Module):
    """Packed experts: ``gate_up_proj`` ``[E, 2I, H]`` (gate rows, then up rows)
    and ``down_proj`` ``[E, H, I]``; each expert is ``down(act(gate x) * up x)``.

    ``x`` ``[T, H]``, ``weights``/``experts`` ``[T, k]`` -> ``[T, H]``: the sum of
    each row's chosen experts times their weights. Each expert runs once on its
    rows (:func:`~flide_ext.layers.linear.linear`: on the CPU a row's result does
    not depend on how many rows its expert got).
    """

    def __init__(self, config):
        super().__init__()
        E, H, inner = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * inner, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, inner))
        self.act = ACT2FN[config.hidden_activation]

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in torch.unique(experts).tolist():
            rows, rank = torch.nonzero(experts == e, as_tuple=True)
            gate, up = linear(x[rows], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = linear(act_mul(self.act, gate, up), self.down_proj[e])
            out.index_add_(0, rows, y * weights[rows, rank, None])
        return out


def moe_output(router: Gemma4Router, experts: Gemma4Experts, pre_norm: WeightedRMSNorm,
               x: torch.Tensor) -> torch.Tensor:
    """The experts' output ``[T, H]`` in the weights' dtype for the block input
    ``x`` ``[T, H]`` (the residual stream after attention)."""
    weights, chosen = router(x)
    return experts(pre_norm(x).to(experts.down_proj.dtype), weights, chosen)
