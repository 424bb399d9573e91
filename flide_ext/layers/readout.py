"""Selective readout: the final norm and LM head run only on readout rows, the
logits kept in float32 (a bf16 logit of magnitude 32-64 is rounded by up to
0.125, which moves a label's probability more than the rest of a bf16 forward
does; SGLang's ``--enable-fp32-lm-head`` keeps them for the same reason)."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .linear import at_checked_rows, gemm_key, linear


def lm_head_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` with the products accumulated in float32 or wider and the
    result not rounded back to the model's dtype.

    Args:
        x: ``[R, hidden]`` normalised hidden states (the model's dtype).
        weight: ``[vocab, hidden]`` the LM head's weight.

    Returns:
        ``[R, vocab]`` float32 logits. On CUDA a bf16 / fp16 GEMM with a float32
        output (``torch.mm(..., out_dtype=torch.float32)``, which deterministic
        mode runs at a checked row count); on CPU a float64 GEMM rounded
        once to float32, whose value does not depend on the number of rows
        (:mod:`flide_ext.layers.linear`).
    """
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return linear(x, weight)
    if x.is_cuda and x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    if x.device.type == "cpu":
        return F.linear(x.double(), weight.double()).float()
    return F.linear(x.float(), weight.float())


def readout_normed(hidden: torch.Tensor, rows: torch.Tensor, norm: nn.Module, lm_head: nn.Linear) -> torch.Tensor:
    """The final norm at the readout rows, rounded once to the LM head's dtype:
    what the LM head reads (the full vocabulary's logits, or only some labels').

    Args:
        hidden: ``[T, hidden]`` last-layer hidden states of the stream (the
            residual stream's dtype: float32 beside a bf16 model's weights).
        rows: ``[R]`` int64 stream rows to read (each question's last prompt token).
        norm: the model's final norm.
        lm_head: the model's output projection (``[vocab, hidden]`` weight, no bias).

    Returns:
        ``[R, hidden]`` in the LM head's dtype.

    Raises:
        ValueError: ``lm_head`` has a bias.
    """
    if lm_head.bias is not None:
        raise ValueError("the readout's LM head has no bias in the models Flide serves; this one has")
    # The final norm computes in float32 whatever its input; its output is
    # rounded once, to the LM head's dtype, as every other GEMM input is.
    return norm(hidden.index_select(0, rows)).to(lm_head.weight.dtype)


def readout_logprobs(
    hidden: torch.Tensor, rows: torch.Tensor, norm: nn.Module, lm_head: nn.Linear, softcap: Optional[float] = None
) -> torch.Tensor:
    """Full-vocabulary log-probabilities at the readout rows: :func:`head_logprobs`
    of :func:`readout_normed` (whose arguments and errors these are; ``softcap``
    as :func:`head_logprobs`).

    Returns:
        ``[R, vocab]`` float32 log-softmax of the float32 logits (:func:`lm_head_logits`).
    """
    return head_logprobs(readout_normed(hidden, rows, norm, lm_head), lm_head.weight, softcap)


def normalised_over_labels(logits: list[float]) -> list[float]:
    """``logits - logsumexp(logits)`` in Python floats: log-probabilities over
    these labels alone (what a softmax over them needs: it does not change when
    every logit moves by the same amount, so the vocabulary's log-normaliser can
    be left out).

    Args:
        logits: one question's label logits (float32 values).

    Returns:
        As many log-probabilities, whose exponentials sum to 1 (to rounding);
        none for none.
    """
    if not logits:
        return []
    top = max(logits)
    if math.isinf(top):  # every logit -inf (or one +inf): nothing to normalise by
        return [0.0 if x == top else -math.inf for x in logits] if top > 0 else list(logits)
    norm = top + math.log(math.fsum(math.exp(x - top) for x in logits))
    return [x - norm for x in logits]


def readout_key(weight: torch.Tensor, x_dtype: torch.dtype) -> tuple:
    """The readout's key among deterministic mode's GEMMs (:func:`~.linear.gemm_key`)."""
    return ("readout", *gemm_key(weight, x_dtype, torch.float32, False))


def soft_capped(logits: torch.Tensor, softcap: Optional[float]) -> torch.Tensor:
    """``softcap * tanh(logits / softcap)`` (final logit soft-capping, Gemma 2-4;
    the checkpoints' ``final_logit_softcapping``), in the logits' dtype; the
    logits themselves for None."""
    if softcap is None:
        return logits
    return torch.tanh(logits / softcap) * softcap


def head_logprobs(x: torch.Tensor, weight: torch.Tensor, softcap: Optional[float] = None) -> torch.Tensor:
    """``[R, hidden]`` -> ``[R, vocab]`` float32 log-softmax of :func:`lm_head_logits`
    (soft-capped first with ``softcap``, :func:`soft_capped`);
    in deterministic mode on the GPU run at a checked row count
    (:func:`~.linear.at_checked_rows`), the log-softmax with it."""
    return at_checked_rows(lambda a: torch.log_softmax(soft_capped(lm_head_logits(a, weight), softcap), dim=-1), x,
                           readout_key(weight, x.dtype))
