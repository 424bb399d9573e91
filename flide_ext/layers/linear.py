"""Linear layer whose CPU float32 result does not depend on the round's shape.

A CPU float32 GEMM (MKL / oneDNN) picks its blocking and reduction order by the
number of rows, so the same row can come out a few ulps apart when it is computed
alone or among thousands of other rows; over 30 layers that reaches ~1e-5 in a
label log-probability. On CPU this layer accumulates float32 inputs in float64
and rounds once to float32: the rounded result is the same (up to rare
double-rounding ties) wherever the row sits, which is what lets a question
answered inside a round match the same question answered alone. Other dtypes and
devices use the ordinary GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``: ``x`` ``[T, in]``, ``weight`` ``[out, in]`` -> ``[T, out]``
    in ``x.dtype``, row-invariant on CPU float32 (see the module docstring)."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return F.linear(x.double(), weight.double(), None if bias is None else bias.double()).float()
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict names) computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
