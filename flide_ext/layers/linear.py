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


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict names); ``x`` ``[T, in]`` ->
    ``[T, out]`` in ``x.dtype``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == torch.float32:
            bias = None if self.bias is None else self.bias.double()
            return F.linear(x.double(), self.weight.double(), bias).float()
        return super().forward(x)
