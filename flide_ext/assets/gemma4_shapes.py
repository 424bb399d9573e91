"""Gemma 4 text shapes for random-weight benchmark checkpoints.

Read from the published checkpoints' ``config.json`` text parts as quoted in
public code (several independent projects agree): E4B is 42 layers of width
2,560 (five sliding layers of head size 256, then one full layer of 512; the
last 18 layers read earlier layers' K/V; per-layer embeddings of 256), 31B is
60 layers of width 5,376 (full layers with 4 K/V heads whose values are their
keys), both with a 262,144-token vocabulary, a tied head and soft-capping at 30.
Weights are random (speed does not depend on them); the tokenizer saved beside
them is a stand-in (the Qwen3.5 one, whose ids all fall inside Gemma's
vocabulary), since Gemma's own is not shipped here.
"""

from __future__ import annotations

_PATTERN = ["sliding_attention"] * 5 + ["full_attention"]

# name: (hidden, layers, heads, kv heads, full-layer kv heads (K = V) or None, ffn, window, shared layers, per-layer size)
GEMMA4_SHAPES = {
    "gemma4-e4b": (2560, 42, 8, 2, None, 10240, 512, 18, 256),
    "gemma4-31b": (5376, 60, 32, 16, 4, 21504, 1024, 0, 0),
}


def gemma4_config(shape: str, **overrides):
    """The transformers ``Gemma4TextConfig`` of a named Gemma 4 shape.

    Raises:
        KeyError: an unknown shape name.
    """
    from transformers import Gemma4TextConfig

    hidden, layers, heads, kv, full_kv, ffn, window, shared, per_layer = GEMMA4_SHAPES[shape]
    config = Gemma4TextConfig(**{
        "vocab_size": 262144, "hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": ffn,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 256, "global_head_dim": 512,
        "attention_k_eq_v": full_kv is not None, "num_global_key_value_heads": full_kv,
        "sliding_window": window, "layer_types": (_PATTERN * (layers // len(_PATTERN)))[:layers],
        "num_kv_shared_layers": shared, "hidden_size_per_layer_input": per_layer,
        "vocab_size_per_layer_input": 262144, "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
        "max_position_embeddings": 131072 if shared else 262144, "rms_norm_eps": 1e-6, **overrides,
    })
    config.architectures = ["Gemma4ForCausalLM"]
    return config
