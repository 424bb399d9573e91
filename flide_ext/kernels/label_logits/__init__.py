"""The LM head's logits of chosen labels: the public function (argument checks
and dispatch); reference in :mod:`.reference`, kernel in :mod:`.kernel`."""

from __future__ import annotations

from typing import Optional

import torch

from ..arguments import float32_math_dtypes
from ..dispatch import backend_for, checked_reference
from . import reference

__all__ = ["label_logits", "label_logits_ref"]


def _check(x: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"label_logits: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be "
                         "[R, hidden] and [vocab, hidden]")
    if not x.is_floating_point():
        raise ValueError(f"label_logits: x dtype {x.dtype} is not a floating-point dtype")
    if weight.dtype != x.dtype:
        raise ValueError(f"label_logits: x dtype {x.dtype} and weight dtype {weight.dtype} differ")
    if rows.dim() != 1 or labels.shape != rows.shape:
        raise ValueError(f"label_logits: rows {tuple(rows.shape)} and labels {tuple(labels.shape)} must both be [P]")
    if rows.dtype != torch.int64 or labels.dtype != torch.int64:
        raise ValueError(f"label_logits: rows ({rows.dtype}) and labels ({labels.dtype}) must be int64")


def label_logits(x: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor,
                 backend: Optional[str] = None) -> torch.Tensor:
    """:func:`~.reference.label_logits_ref`'s contract; with ``backend``
    ``"triton"`` (or None on CUDA) the Triton kernel (float32 accumulation) for
    float32, bfloat16 or float16 inputs (float64 takes the reference).

    Raises:
        ValueError: shapes or dtypes other than the contract's. Row and label
            ids are not checked against the bounds (the caller's readout knows them).
    """
    _check(x, weight, rows, labels)
    if backend_for(x, backend) == "triton" and float32_math_dtypes(x, weight):
        from .kernel import label_logits_triton

        return label_logits_triton(x, weight, rows, labels)
    return reference.label_logits_ref(x, weight, rows, labels)


label_logits_ref = checked_reference(label_logits, reference.label_logits_ref)
