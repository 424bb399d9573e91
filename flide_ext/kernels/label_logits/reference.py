"""The LM head's logits of chosen labels only: a readout normalised over its
labels needs each question's label logits, not the vocabulary's (the softmax
over a set of labels does not change when every logit moves by the same
log-normaliser). One dot product per (readout row, label) pair, instead of the
``[R, vocab]`` product."""

from __future__ import annotations

import torch


def label_logits_ref(x: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch reference: each pair's dot product computed in float64 and
    rounded once to float32 (as :func:`flide_ext.layers.readout.lm_head_logits`
    computes a CPU logit), so a pair's value does not depend on the others.

    Args:
        x: ``[R, hidden]`` normalised readout rows (the LM head's dtype).
        weight: ``[vocab, hidden]`` the LM head's weight, in ``x.dtype``.
        rows: ``[P]`` int64 row of ``x`` of each pair.
        labels: ``[P]`` int64 vocabulary id of each pair.

    Returns:
        ``[P]`` float32 logits ``x[rows[p]] . weight[labels[p]]``.

    Arguments are checked by :func:`flide_ext.kernels.label_logits.label_logits`.
    """
    a = x.index_select(0, rows).double()
    b = weight.index_select(0, labels).double()
    return (a * b).sum(-1).float()
