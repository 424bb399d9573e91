"""Tiny random-weight Hugging Face checkpoints for tests, written with transformers."""

from __future__ import annotations

from pathlib import Path

import torch


def tiny_config(family: str, vocab_size: int = 512, **overrides):
    from transformers import LlamaConfig, Qwen3_5TextConfig, Qwen3Config, Qwen3NextConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    if family == "llama":
        cfg = LlamaConfig(**{**common, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **overrides})
        cfg.architectures = ["LlamaForCausalLM"]
    elif family == "qwen3":
        cfg = Qwen3Config(**{**common, "head_dim": 32, **overrides})
        cfg.architectures = ["Qwen3ForCausalLM"]
    elif family in ("qwen3_5", "qwen3_next"):
        hybrid = dict(
            common,
            num_hidden_layers=4,
            head_dim=32,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
        )
        if family == "qwen3_5":
            cfg = Qwen3_5TextConfig(**{**hybrid, **overrides})
            cfg.architectures = ["Qwen3_5ForCausalLM"]
        else:
            moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[1])
            cfg = Qwen3NextConfig(**{**hybrid, **moe, **overrides})
            cfg.architectures = ["Qwen3NextForCausalLM"]
    elif family.startswith("gemma4"):
        cfg = gemma4_tiny_config(family, common, overrides)
    else:
        raise ValueError(family)
    return cfg


def gemma4_tiny_config(family: str, common: dict, overrides: dict):
    """Gemma 4 text configs: ``gemma4_dense`` (sliding and full layers only),
    ``gemma4`` (also per-layer embeddings, KV sharing, K = V on full layers, a
    double-wide MLP on shared layers and soft-capping) and ``gemma4_moe`` (that
    and experts beside every MLP). Full layers have their own head size and K/V
    head count; the last layer is full."""
    from transformers import Gemma4TextConfig

    base = dict(common, num_hidden_layers=6, head_dim=16, global_head_dim=32, sliding_window=512,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                hidden_size_per_layer_input=0, tie_word_embeddings=True, max_position_embeddings=4096)
    if family != "gemma4_dense":
        base.update(hidden_size_per_layer_input=8, vocab_size_per_layer_input=common["vocab_size"],
                    num_kv_shared_layers=3, use_double_wide_mlp=True, attention_k_eq_v=True,
                    num_global_key_value_heads=1, final_logit_softcapping=30.0)
    if family == "gemma4_moe":
        base.update(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
    elif family not in ("gemma4", "gemma4_dense"):
        raise ValueError(family)
    cfg = Gemma4TextConfig(**{**base, **overrides})
    cfg.architectures = ["Gemma4ForCausalLM"]
    return cfg


def write_tiny_checkpoint(directory: Path, family: str, seed: int = 0, head_scale: float = 4.0, **overrides) -> Path:
    """A float32 random model saved as an ordinary checkpoint directory.

    ``head_scale`` multiplies the LM head so label distributions are peaked, as a
    trained model's are, which makes argmax comparisons meaningful.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(family, **overrides)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.1)
            elif name.endswith("norm.weight") and family in ("qwen3_5", "qwen3_next"):
                p.normal_(0.0, 0.1)  # zero-centred norms: random offsets from 1
            elif name.endswith("A_log"):
                p.uniform_(-1.0, 1.0)
            elif family.startswith("gemma4"):
                p.normal_(1.0, 0.3)  # norm weights (the scale itself), router and expert scales
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):  # stored in Gemma 4 checkpoints
                b.uniform_(0.5, 1.5)
        if not cfg.tie_word_embeddings:
            model.lm_head.weight.mul_(head_scale)
    directory = Path(directory)
    model.save_pretrained(directory)
    return directory


def hf_label_logprobs(model, prompt: list[int], labels: list[int]) -> list[float]:
    """Float32 transformers forward of the full prompt: log-probabilities of the
    labels at its last token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].float()
    return torch.log_softmax(logits, -1)[labels].tolist()


CHAR_TEMPLATE = (
    "{% for m in messages %}<|user|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_char_tokenizer(directory: Path) -> Path:
    """A character-level tokenizer with a chat template: every printable ASCII
    character is one token, so ``A``..``Z`` and digits are one-token labels while
    ``yes`` and ``no`` are not. Vocabulary size 100 (ids 0..99)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {c: i for i, c in enumerate(chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>", "<|end|>"]})
    fast.chat_template = CHAR_TEMPLATE
    directory = Path(directory)
    fast.save_pretrained(directory)
    return directory
