"""Shared fixtures: tiny random checkpoints, the real SmolLM2, their HF references."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Flide's Triton kernels run on a CPU machine only under the Triton
    # interpreter, which triton.jit picks at decoration time: it must be set
    # before anything imports triton (transformers and accelerate may).
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The test environment is float32 on CPU; keep results independent of thread timing.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

from test.helpers.checkpoints import write_char_tokenizer, write_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Family -> directory of a tiny random float32 checkpoint (vocab 512): llama,
    qwen3, and the GDN hybrids qwen3_5 and qwen3_next."""
    root = tmp_path_factory.mktemp("tiny")
    families = ["llama", "qwen3", "qwen3_5", "qwen3_next"]
    return {fam: write_tiny_checkpoint(root / fam, fam, seed=i) for i, fam in enumerate(families)}


@pytest.fixture(scope="session")
def tiny_engines(tiny_dirs):
    from flide_ext import Engine

    return {fam: Engine(str(d)) for fam, d in tiny_dirs.items()}


@pytest.fixture(scope="session")
def tiny_hf(tiny_dirs):
    from transformers import AutoModelForCausalLM

    return {
        fam: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for fam, d in tiny_dirs.items()
    }


@pytest.fixture(scope="session")
def char_model_dir(tmp_path_factory):
    """A tiny random Llama with the character-level chat tokenizer, for decision
    requests without a large tokenizer."""
    d = tmp_path_factory.mktemp("charllama")
    write_tiny_checkpoint(d, "llama", seed=7, vocab_size=128)
    write_char_tokenizer(d)
    return d


@pytest.fixture(scope="session")
def smollm2_engine():
    from flide_ext import Engine

    return Engine("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_engine):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_engine.path, dtype=torch.float32).eval()
