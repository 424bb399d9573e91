"""Selective readout: the final norm and LM head run only on readout rows."""

from __future__ import annotations

import torch
from torch import nn


def readout_logprobs(
    hidden: torch.Tensor, rows: torch.Tensor, norm: nn.Module, lm_head: nn.Linear
) -> torch.Tensor:
    """Full-vocabulary log-probabilities at the readout rows.

    Args:
        hidden: ``[T, hidden]`` last-layer hidden states of the stream.
        rows: ``[R]`` int64 stream rows to read (each question's last prompt token).
        norm: the model's final norm.
        lm_head: the model's output projection (``[vocab, hidden]`` weight).

    Returns:
        ``[R, vocab]`` float32 log-softmax of the logits.
    """
    logits = lm_head(norm(hidden.index_select(0, rows)))
    return torch.log_softmax(logits.float(), dim=-1)
