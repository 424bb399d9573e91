"""Llama and Qwen3 decoder-only models over a round's flat stream.

Both are pre-norm decoders with GQA, RoPE, RMSNorm and a SwiGLU MLP (Touvron et
al., 2023, "Llama 2"; Qwen3 technical report, 2025). Qwen3 adds per-head RMSNorm
on queries and keys before RoPE. Module names mirror the Hugging Face checkpoints
so their safetensors load by name.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers.attention import ForkSelfAttention
from ..layers.linear import Linear
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from ..layers.readout import readout_logprobs
from ..layers.rotary import RotaryEmbedding


class DecoderLayer(nn.Module):
    def __init__(self, config, qk_norm: bool):
        super().__init__()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.self_attn = ForkSelfAttention(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
            bias=getattr(config, "attention_bias", False),
            qk_norm_eps=config.rms_norm_eps if qk_norm else None,
        )
        self.mlp = GatedMLP(
            config.hidden_size, config.intermediate_size, config.hidden_act,
            bias=getattr(config, "mlp_bias", False),
        )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, plan, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), plan, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, config, qk_norm: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, qk_norm) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Llama-family causal LM over a flat stream.

    ``forward(plan)`` returns ``[R, vocab]`` float32 log-probabilities at the
    plan's readout rows (selective readout: the final norm and LM head see only
    those rows).
    """

    qk_norm = False

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, self.qk_norm)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.rotary = RotaryEmbedding(config, head_dim)

    @property
    def tied_weights(self) -> dict[str, str]:
        """Parameters that checkpoints may omit because they share another's tensor."""
        if getattr(self.config, "tie_word_embeddings", False):
            return {"lm_head.weight": "model.embed_tokens.weight"}
        return {}

    def hidden_states(self, plan) -> torch.Tensor:
        """Last-layer hidden states ``[T, hidden]`` (before the final norm)."""
        x = self.model.embed_tokens(plan.token_ids)
        cos, sin = self.rotary.cos_sin(plan.positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, plan, cos, sin)
        return x

    def forward(self, plan) -> torch.Tensor:
        h = self.hidden_states(plan)
        return readout_logprobs(h, plan.readout_rows, self.model.norm, self.lm_head)


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 dense causal LM: Llama plus per-head q/k RMSNorm."""

    qk_norm = True
