"""Hybrid Gated DeltaNet models: Qwen3.5 (dense) and Qwen3-Next (MoE), text part.

Layer pattern from the config's ``layer_types`` (``linear_attention`` = GDN,
``full_attention`` = gated attention with per-head zero-centred q/k RMSNorm and
partial rotary), zero-centred RMSNorm everywhere else (Qwen3.5 and Qwen3-Next
model cards). Qwen3.5 checkpoints load from ``Qwen3_5ForCausalLM`` and from the
multimodal ``Qwen3_5ForConditionalGeneration`` (vision weights skipped).
"""

from __future__ import annotations

from typing import Optional

from torch import nn

from ..layers.attention import ForkSelfAttention
from ..layers.gated_deltanet import GatedDeltaNet, PackedGatedDeltaNet
from ..layers.linear import Linear
from ..layers.mlp import GatedMLP
from ..layers.moe import SparseMoeBlock
from ..layers.norm import ZeroCenteredRMSNorm
from .base import FlatCausalLM, head_dim_of, pre_norm_block


def text_config(config):
    """The text part of a (possibly multimodal) Qwen3.5 config."""
    return getattr(config, "text_config", None) or config


class HybridDecoderLayer(nn.Module):
    def __init__(self, config, layer_type: str, attn_index: int, gdn_index: int, gdn_cls, mlp: nn.Module):
        super().__init__()
        if layer_type == "linear_attention":
            self.linear_attn = gdn_cls(config, gdn_index)
            self.mixer = self.linear_attn
        elif layer_type == "full_attention":
            self.self_attn = ForkSelfAttention(
                config.hidden_size,
                config.num_attention_heads,
                config.num_key_value_heads,
                head_dim_of(config),
                index=attn_index,
                bias=getattr(config, "attention_bias", False),
                qk_norm=ZeroCenteredRMSNorm,
                norm_eps=config.rms_norm_eps,
                gated=True,
            )
            self.mixer = self.self_attn
        else:
            raise ValueError(f"layer type {layer_type!r} is not supported")
        self.mlp = mlp
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, ctx):
        return pre_norm_block(x, residual, ctx, self.input_layernorm, self.mixer, self.post_attention_layernorm,
                              self.mlp)


class HybridModel(nn.Module):
    def __init__(self, config, gdn_cls, make_mlp):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        layers, attn, gdn = [], 0, 0
        for i, layer_type in enumerate(config.layer_types[: config.num_hidden_layers]):
            layers.append(HybridDecoderLayer(config, layer_type, attn, gdn, gdn_cls, make_mlp(config, i)))
            attn += layer_type == "full_attention"
            gdn += layer_type == "linear_attention"
        self.layers = nn.ModuleList(layers)
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.num_gdn_layers = gdn


class Qwen3_5ForCausalLM(FlatCausalLM):
    """Qwen3.5 dense hybrid (GDN + gated attention) causal LM over a flat stream."""

    gdn_cls = GatedDeltaNet

    def __init__(self, config):
        config = text_config(config)
        super().__init__(config)
        self.model = HybridModel(config, self.gdn_cls, self.make_mlp)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.num_gdn_layers = self.model.num_gdn_layers

    @staticmethod
    def make_mlp(config, index: int) -> nn.Module:
        return GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)

    def gdn_state_shapes(self):
        """``(recurrent_shape, conv_shape)`` of one state-pool slot per GDN layer."""
        for layer in self.model.layers:
            if hasattr(layer, "linear_attn"):
                return layer.linear_attn.state_shapes()
        return None

    def checkpoint_name(self, name: str) -> Optional[str]:
        if name.startswith("model.language_model."):  # Qwen3_5ForConditionalGeneration
            return "model." + name[len("model.language_model.") :]
        if name.startswith(("model.visual.", "mtp.")):
            return None
        return name


class Qwen3NextForCausalLM(Qwen3_5ForCausalLM):
    """Qwen3-Next hybrid MoE causal LM: packed GDN projections and sparse MoE
    blocks (every ``decoder_sparse_step``-th layer not in ``mlp_only_layers``)."""

    gdn_cls = PackedGatedDeltaNet

    @staticmethod
    def make_mlp(config, index: int) -> nn.Module:
        sparse = (
            index not in (config.mlp_only_layers or [])
            and config.num_experts > 0
            and (index + 1) % config.decoder_sparse_step == 0
        )
        if sparse:
            return SparseMoeBlock(config)
        return GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
