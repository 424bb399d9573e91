"""Linear layer whose CPU result does not depend on the round's shape.

A CPU GEMM (MKL / oneDNN) picks its blocking and reduction order by the number
of rows, in float32 and in bf16 / fp16 alike, so the same row can come out a few
ulps apart when it is computed alone or among thousands of other rows; over 30
layers that reaches ~1e-5 in a float32 label log-probability, and flips bf16 /
fp16 bits. On CPU this layer accumulates in float64 and rounds once to the
input's dtype: the rounded result is the same (up to rare double-rounding ties)
wherever the row sits, which is what lets a question answered inside a round
match the same question answered alone. GPU GEMMs are made row-invariant by
deterministic mode (:mod:`flide_ext.runtime.determinism`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``: ``x`` ``[T, in]``, ``weight`` ``[out, in]`` -> ``[T, out]``
    in ``x.dtype``, row-invariant on CPU (see the module docstring)."""
    if x.device.type == "cpu" and x.is_floating_point():
        return F.linear(x.double(), weight.double(), None if bias is None else bias.double()).to(x.dtype)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict names) computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class StackedLinear:
    """Several :class:`Linear` layers over one input as one GEMM: their weights
    are stacked into one ``[sum(out), in]`` tensor and the layers' parameters
    become views of it, so the checkpoint names, the loader and the memory stay
    as they were. Small projections (a GDN layer's ``[T, 32]`` write strength and
    decay) cost a whole GEMM launch each on their own.

    Not a module (its layers keep their parameters). The stack is built on the
    first call and again whenever a layer's parameter no longer lies in it
    (``model.to(...)`` or a reassigned ``.data``), so it is always the layers'
    current weights.

    Args:
        layers: Linear layers of one input width, all with or all without bias.

    Raises:
        ValueError: input widths differ, or some layers have a bias and some not
            (and, at the first call, weights of different dtypes or devices).
    """

    def __init__(self, *layers: Linear):
        if len({layer.in_features for layer in layers}) != 1:
            raise ValueError("stacked linear layers must share their input width")
        if len({layer.bias is None for layer in layers}) != 1:
            raise ValueError("stacked linear layers must all have a bias or all have none")
        self.layers = layers
        self.sizes = [layer.out_features for layer in layers]
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    def _stacked(self, name: str, current: torch.Tensor | None) -> torch.Tensor | None:
        params = [getattr(layer, name) for layer in self.layers]
        if params[0] is None:
            return None
        if len({(p.dtype, p.device) for p in params}) != 1:
            raise ValueError(f"stacked linear layers must share their {name}s' dtype and device, not "
                             + ", ".join(f"{p.dtype} on {p.device}" for p in params))
        if current is not None and current.device == params[0].device and current.dtype == params[0].dtype:
            at, inside = 0, True
            for p, n in zip(params, self.sizes):
                inside &= p.data_ptr() == current[at:at + n].data_ptr() and p.shape == current[at:at + n].shape
                at += n
            if inside:
                return current
        # Built outside inference mode, so the parameters stay ordinary tensors
        # that a later load may copy into.
        with torch.inference_mode(False), torch.no_grad():
            stacked = torch.cat([p.detach() for p in params])
            at = 0
            for p, n in zip(params, self.sizes):
                p.data = stacked[at:at + n]
                at += n
        return stacked

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x`` ``[T, in]`` -> each layer's output ``[T, out_i]`` (column views of one
        ``[T, sum(out)]`` result, in ``x.dtype``). When autograd records (a
        parameter requires grad, outside no-grad and inference mode) the layers
        run one by one, so gradients reach their parameters.

        Raises:
            ValueError: the layers' weights (or biases) differ in dtype or device.
        """
        if torch.is_grad_enabled() and any(p.requires_grad for layer in self.layers for p in layer.parameters()):
            return [layer(x) for layer in self.layers]
        self._weight = self._stacked("weight", self._weight)
        self._bias = self._stacked("bias", self._bias)
        return list(torch.split(linear(x, self._weight, self._bias), self.sizes, dim=-1))
