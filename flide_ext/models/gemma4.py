"""Gemma 4 text models over a round's flat stream (transformers 5.19,
``models/gemma4``; Gemma 4 model card): sliding-window and full attention
layers (:mod:`~flide_ext.layers.gemma4_blocks`), embeddings scaled by
``sqrt(hidden)``, per-layer embeddings, a per-layer scalar on the hidden state,
norms after each block as well as before, an optional mixture of experts beside
every dense MLP, a tied LM head and final logit soft-capping.

Each decoder layer (``h``: the hidden state, kept in the residual stream's dtype)::

    h = h + post_attention_norm(attention(input_norm(h)))
    m = mlp(pre_feedforward_norm(h))
    m = post_feedforward_norm_1(m) + post_feedforward_norm_2(experts(h))   # MoE checkpoints
    h = h + post_feedforward_norm(m)
    h = h + post_per_layer_input_norm(projection(act(gate(h)) * per_layer_input))   # per-layer embeddings
    h = h * layer_scalar

Loads ``Gemma4ForCausalLM`` checkpoints and the text part of
``Gemma4ForConditionalGeneration`` ones (``model.language_model.``; the vision
and audio towers are skipped).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from transformers.activations import ACT2FN

from ..layers.context import ForwardContext
from ..layers.gemma4_blocks import Gemma4Attention, Gemma4Experts, Gemma4Router, moe_output
from ..layers.linear import Linear
from ..layers.mlp import GatedMLP, act_mul
from ..layers.norm import WeightedRMSNorm
from ..layers.rotary import RotaryEmbedding
from .base import FlatCausalLM

_SKIPPED = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")


def kv_sources(config) -> list[Optional[int]]:
    """Per layer, the layer whose K/V it reads (its own index for a layer that
    is not KV-shared): a shared layer reads the last layer of its type before the
    first shared one.

    Raises:
        ValueError: a shared layer whose type has no layer before the first shared one.
    """
    types = config.layer_types[: config.num_hidden_layers]
    first = len(types) - (getattr(config, "num_kv_shared_layers", 0) or 0)
    out = []
    for i, layer_type in enumerate(types):
        if i < first:
            out.append(i)
            continue
        earlier = [j for j in range(first) if types[j] == layer_type]
        if not earlier:
            raise ValueError(f"Gemma 4 layer {i} ({layer_type}) shares K/V, but no layer of its type comes before the "
                             f"first shared layer ({first})")
        out.append(earlier[-1])
    return out


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, config, layer: int, index: int, lends: bool, shared: bool):
        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        self.layer = layer
        self.self_attn = Gemma4Attention(config, layer, index, shared, lends)
        wide = shared and getattr(config, "use_double_wide_mlp", False)
        self.mlp = GatedMLP(H, config.intermediate_size * (2 if wide else 1), config.hidden_activation)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, WeightedRMSNorm(H, eps))
        self.layer_scalar = nn.Parameter(torch.ones(1))  # a buffer in transformers, stored in the checkpoints
        self.per_layer_size = config.hidden_size_per_layer_input or 0
        if self.per_layer_size:
            self.act = ACT2FN[config.hidden_activation]
            self.per_layer_input_gate = Linear(H, self.per_layer_size, bias=False)
            self.per_layer_projection = Linear(self.per_layer_size, H, bias=False)
            self.post_per_layer_input_norm = WeightedRMSNorm(H, eps)
        self.moe = bool(getattr(config, "enable_moe_block", False))
        if self.moe:
            self.router = Gemma4Router(config)
            self.experts = Gemma4Experts(config)
            self.pre_feedforward_layernorm_2 = WeightedRMSNorm(H, eps)
            self.post_feedforward_layernorm_1 = WeightedRMSNorm(H, eps)
            self.post_feedforward_layernorm_2 = WeightedRMSNorm(H, eps)

    def forward(self, x, residual, ctx: ForwardContext):
        """``x`` ``[T, hidden]`` the hidden state (the embeddings at the first
        layer; ``residual`` is always None: the hidden state is carried whole)
        -> ``(hidden state, None)`` in the residual stream's dtype."""
        dtype = self.mlp.down_proj.weight.dtype
        h = x.to(ctx.residual_dtype or x.dtype)
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h).to(dtype), ctx))
        m = self.mlp(self.pre_feedforward_layernorm(h).to(dtype))
        if self.moe:
            experts = moe_output(self.router, self.experts, self.pre_feedforward_layernorm_2, h)
            m = self.post_feedforward_layernorm_1(m) + self.post_feedforward_layernorm_2(experts)
        h = h + self.post_feedforward_layernorm(m)
        if self.per_layer_size:
            z = act_mul(self.act, self.per_layer_input_gate(h.to(dtype)), ctx.per_layer_inputs[:, self.layer])
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(z))
        return h * self.layer_scalar, None


class Gemma4Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        H, L = config.hidden_size, config.num_hidden_layers
        self.embed_tokens = nn.Embedding(config.vocab_size, H)
        sources = kv_sources(config)
        owners = sorted(set(sources))
        index = {layer: rank for rank, layer in enumerate(owners)}  # K/V pool rank of each owning layer
        lenders = {s for i, s in enumerate(sources) if s != i}
        self.layers = nn.ModuleList(
            Gemma4DecoderLayer(config, i, index[s], s in lenders, s != i) for i, s in enumerate(sources))
        self.norm = WeightedRMSNorm(H, config.rms_norm_eps)
        self.per_layer_size = config.hidden_size_per_layer_input or 0
        if self.per_layer_size:
            self.embed_tokens_per_layer = nn.Embedding(config.vocab_size_per_layer_input, L * self.per_layer_size)
            self.per_layer_model_projection = Linear(H, L * self.per_layer_size, bias=False)
            self.per_layer_projection_norm = WeightedRMSNorm(self.per_layer_size, config.rms_norm_eps)


class Gemma4ForCausalLM(FlatCausalLM):
    """Gemma 4 causal LM (dense or MoE, text part) over a flat stream."""

    @classmethod
    def gpu_gap(cls, config) -> Optional[str]:
        """The MoE variant stays on the CPU: its experts' loop reads on the host
        which experts a round chose (no CUDA graph can hold that), and their
        GEMMs' row counts follow the round, outside deterministic mode's checks."""
        if getattr(config, "enable_moe_block", False):
            return ("its MoE block (enable_moe_block) chooses experts on the host, which no CUDA graph can hold; "
                    "the dense Gemma 4 checkpoints run on the GPU")
        return None

    def __init__(self, config):
        config = getattr(config, "text_config", None) or config
        super().__init__(config)
        self.model = Gemma4Model(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.logit_softcap = config.final_logit_softcapping

    @property
    def token_vocab_size(self) -> int:
        # A per-layer embedding table shorter than the vocabulary (never in the
        # published checkpoints) has no row for the ids past it.
        if self.model.per_layer_size:
            return min(int(self.config.vocab_size), int(self.config.vocab_size_per_layer_input))
        return int(self.config.vocab_size)

    def make_rotary(self, config) -> dict:
        return {layer_type: RotaryEmbedding(config, config.per_layer_config[layer_type].head_dim,
                                            layer_type=layer_type)
                for layer_type in dict.fromkeys(config.layer_types[: config.num_hidden_layers])}

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> dict:
        return {layer_type: rope.cos_sin(positions, dtype) for layer_type, rope in self.rotary.items()}

    def embed(self, ctx: ForwardContext) -> torch.Tensor:
        # The scales are rounded to the weights' dtype first, as the checkpoint's
        # own embedding modules do (sqrt(2560) is 50.5 in bf16).
        ids, model = ctx.plan.token_ids, self.model
        weight = model.embed_tokens.weight
        x = model.embed_tokens(ids) * torch.tensor(self.config.hidden_size**0.5).to(weight.dtype)
        if model.per_layer_size:
            P = model.per_layer_size
            table = model.embed_tokens_per_layer
            tokens = table(ids) * torch.tensor(P**0.5).to(table.weight.dtype)
            context = model.per_layer_model_projection(x) * self.config.hidden_size**-0.5
            context = model.per_layer_projection_norm(context.view(x.shape[0], -1, P))
            ctx.per_layer_inputs = (context + tokens.view(x.shape[0], -1, P)) * 2.0**-0.5
        return x

    def checkpoint_name(self, name: str) -> Optional[str]:
        if name.startswith("model.language_model."):  # Gemma4ForConditionalGeneration
            return "model." + name[len("model.language_model.") :]
        if name.startswith(_SKIPPED):
            return None
        return name
