"""Llama and Qwen3 decoder-only models over a round's flat stream.

Both are pre-norm decoders with GQA, RoPE, RMSNorm and a SwiGLU MLP (Touvron et
al., 2023, "Llama 2"; Qwen3 technical report, 2025). Qwen3 adds per-head RMSNorm
on queries and keys before RoPE. Module names mirror the Hugging Face checkpoints
so their safetensors load by name.
"""

from __future__ import annotations

from torch import nn

from ..layers.attention import ForkSelfAttention
from ..layers.linear import Linear
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from .base import FlatCausalLM, head_dim_of, pre_norm_block


class DecoderLayer(nn.Module):
    def __init__(self, config, index: int, qk_norm: bool):
        super().__init__()
        self.self_attn = ForkSelfAttention(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim_of(config),
            index=index,
            bias=getattr(config, "attention_bias", False),
            qk_norm=RMSNorm if qk_norm else None,
            norm_eps=config.rms_norm_eps,
        )
        self.mlp = GatedMLP(
            config.hidden_size, config.intermediate_size, config.hidden_act,
            bias=getattr(config, "mlp_bias", False),
        )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, ctx):
        return pre_norm_block(x, residual, ctx, self.input_layernorm, self.self_attn, self.post_attention_layernorm,
                              self.mlp)


class DecoderModel(nn.Module):
    def __init__(self, config, qk_norm: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, qk_norm) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(FlatCausalLM):
    """Llama-family causal LM over a flat stream."""

    qk_norm = False

    def __init__(self, config):
        super().__init__(config)
        self.model = DecoderModel(config, self.qk_norm)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 dense causal LM: Llama plus per-head q/k RMSNorm."""

    qk_norm = True
