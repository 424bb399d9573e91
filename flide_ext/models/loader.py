"""Build a model from a Hugging Face checkpoint directory (config.json + safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig

from ..protocol.errors import ModelLoadError
from . import MODEL_CLASSES


def load_config(model_dir: str | Path):
    """The checkpoint's transformers config.

    Raises:
        ModelLoadError: no config.json, or one transformers cannot read.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ModelLoadError(f"model path {str(model_dir)!r} has no config.json")
    try:
        return AutoConfig.from_pretrained(model_dir)
    except (ValueError, OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"model path {str(model_dir)!r}: config.json is not readable: {e}") from e


def check_gpu_support(model_class, name: str, device, config) -> None:
    """Refuse a CUDA device for a checkpoint without a GPU path (its class's
    ``gpu_gap(config)``).

    Raises:
        ModelLoadError: naming the architecture and why.
    """
    if torch.device(device).type != "cuda":
        return
    gap = model_class.gpu_gap(getattr(config, "text_config", None) or config)
    if gap:
        raise ModelLoadError(f"architecture {name!r} runs on the CPU only so far: {gap}")


def load_model(model_dir: str | Path, dtype: torch.dtype, device: torch.device | str):
    """Instantiate the checkpoint's architecture and load its weights.

    Returns:
        ``(model, config)``; the model is in eval mode on ``device`` in ``dtype``.

    Raises:
        ModelLoadError: unsupported architecture (or one without a GPU path, on
            a CUDA device), no safetensors, or missing weights.
    """
    model_dir = Path(model_dir)
    config = load_config(model_dir)
    arch = (getattr(config, "architectures", None) or [None])[0]
    if arch not in MODEL_CLASSES:
        raise ModelLoadError(
            f"architecture {arch!r} is not supported; supported: {', '.join(sorted(MODEL_CLASSES))}"
        )
    check_gpu_support(MODEL_CLASSES[arch], arch, device, config)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"model path {str(model_dir)!r} has no .safetensors weights")
    with torch.device("meta"):
        model = MODEL_CLASSES[arch](config)
    model = model.to_empty(device=device).to(dtype)
    params = dict(model.named_parameters())
    loaded = set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for stored in f.keys():
                    name = model.checkpoint_name(stored)
                    if name in params:
                        tensor = f.get_tensor(stored)
                        if tensor.shape != params[name].shape:
                            raise ModelLoadError(
                                f"{file.name}: {stored} has shape {tuple(tensor.shape)}, "
                                f"the config implies {tuple(params[name].shape)}"
                            )
                        with torch.no_grad():
                            params[name].copy_(tensor)
                        loaded.add(name)
        except ModelLoadError:
            raise
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise ModelLoadError(f"cannot read weights {str(file)!r}: {e}") from e
    for name, source in model.tied_weights.items():
        if name not in loaded:
            with torch.no_grad():
                params[name].copy_(params[source])
            loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ModelLoadError(f"checkpoint {str(model_dir)!r} lacks weights: {', '.join(missing[:5])}")
    return model.eval(), config
