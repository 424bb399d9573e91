"""Hugging Face transformers forwards of each question's full prompt, one prompt
per forward: the float32 reference and the plain bf16 baseline.

On a machine with flash-linear-attention installed, transformers' Qwen3.5 and
Qwen3-Next Gated DeltaNet layers call its chunked kernels (bf16 chunk states)
instead of their own PyTorch recurrence. The float32 reference always runs the
PyTorch recurrence (:func:`torch_gdn_path`), with TF32 off, so it is float32
arithmetic throughout; the bf16 baseline runs as transformers picks, and
:func:`gdn_implementation` says which that was.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util

import torch
from tqdm import tqdm

# transformers modules whose GDN functions it may swap for a kernel package's.
GDN_MODULES = ("transformers.models.qwen3_5.modeling_qwen3_5", "transformers.models.qwen3_next.modeling_qwen3_next")
GDN_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update")


def gdn_implementation() -> str:
    """``"fla"`` when transformers' GDN layers would call flash-linear-attention's
    kernels here (the package imports), else ``"torch"``."""
    return "fla" if importlib.util.find_spec("fla") is not None else "torch"


@contextlib.contextmanager
def torch_gdn_path():
    """Within the block, transformers' GDN layers run their own PyTorch functions
    (whatever kernel package it found at import time)."""
    saved = []
    for name in GDN_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for fn in GDN_FUNCTIONS:
            current = getattr(module, fn, None)
            original = getattr(current, "__wrapped__", None)
            if original is not None:
                saved.append((module, fn, current))
                setattr(module, fn, original)
    try:
        yield
    finally:
        for module, fn, current in saved:
            setattr(module, fn, current)


@contextlib.contextmanager
def float32_matmuls():
    """TF32 off for cuBLAS and cuDNN within the block (it is float32's 10-bit-mantissa
    shortcut on NVIDIA GPUs), restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def load(path, dtype: torch.dtype, device) -> torch.nn.Module:
    """The checkpoint at ``path`` as a transformers causal LM in ``dtype`` on ``device``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()


@torch.inference_mode()
def label_logprobs(model, questions: list, device, desc: str, torch_gdn: bool = False) -> list:
    """Per question ``(prompt ids, label ids)`` the label log-probabilities at its
    last token: ``log_softmax`` over the vocabulary of the logits cast to float32.

    Args:
        model: a transformers causal LM.
        questions: ``[(prompt, labels)]``.
        device: where the model is.
        desc: the progress bar's label.
        torch_gdn: run transformers' own GDN functions (:func:`torch_gdn_path`).

    Returns:
        ``[Q]`` lists of ``len(labels)`` floats.
    """
    out = []
    path = torch_gdn_path() if torch_gdn else contextlib.nullcontext()
    with path, float32_matmuls():
        for prompt, labels in tqdm(questions, desc=desc, unit="q", leave=False):
            logits = model(torch.tensor([prompt], device=device), logits_to_keep=1).logits[0, -1].float()
            out.append(torch.log_softmax(logits, -1)[labels].tolist())
    return out
