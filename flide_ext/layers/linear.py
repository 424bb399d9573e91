"""Linear layer whose CPU result does not depend on the round's shape.

A CPU GEMM (MKL / oneDNN) picks its blocking and reduction order by the number
of rows, in float32 and in bf16 / fp16 alike, so the same row can come out a few
ulps apart when it is computed alone or among thousands of other rows; over 30
layers that reaches ~1e-5 in a float32 label log-probability, and flips bf16 /
fp16 bits. On CPU this layer accumulates in float64 and rounds once to the
input's dtype: the rounded result is the same (up to rare double-rounding ties)
wherever the row sits, which is what lets a question answered inside a round
match the same question answered alone. GPU GEMMs are made row-invariant by
deterministic mode (:mod:`flide_ext.runtime.determinism`), which runs each GEMM
at row counts (:class:`GemmRows`) checked to give every row the same bits.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GemmRows:
    """The row counts GEMMs run at in deterministic mode on the GPU.

    A GEMM of ``T`` rows is padded with zero rows to a multiple of the step its
    size falls under, and then, for a padded count listed in ``moved`` under the
    GEMM's key (:func:`gemm_key`), to the larger count given there; the
    result's first ``T`` rows are returned.

    Attributes:
        steps: ``((limit, step), ...)`` by ascending limit: up to ``limit`` rows,
            counts are multiples of ``step``; the last limit is the most rows
            any GEMM may have.
        moved: ``{key: {padded count: count it runs at}}``.
    """

    steps: tuple
    moved: dict

    @property
    def max_rows(self) -> int:
        return self.steps[-1][0]

    def padded_counts(self) -> list[int]:
        """Every padded row count up to :attr:`max_rows`, ascending."""
        out, low = [], 0
        for limit, step in self.steps:
            out += range(-(-(low + 1) // step) * step, limit + 1, step)
            low = limit
        return sorted(set(out))

    def rows(self, t: int, key) -> int:
        """The row count a GEMM of ``t`` rows and key ``key`` runs at.

        Raises:
            ValueError: ``t`` is over :attr:`max_rows` (no count was checked there).
        """
        if t > self.max_rows:
            raise ValueError(f"deterministic mode checked GEMMs up to {self.max_rows} rows, not {t}")
        step = next(s for limit, s in self.steps if t <= limit)
        padded = max(-(-t // step) * step, step)
        return self.moved.get(key, {}).get(padded, padded)


# The row counts of the model whose forward runs in this thread (set by
# checked_rows around it; None: every GEMM at its own row count). A model holds
# its own, so two engines in one process never run at each other's counts.
_GEMM_ROWS: ContextVar[Optional[GemmRows]] = ContextVar("flide_gemm_rows", default=None)


@contextmanager
def checked_rows(rows: Optional[GemmRows]) -> Iterator[None]:
    """Run the GEMMs of :func:`linear` and the readout inside the block at
    ``rows``' row counts (None: at their own), in this thread (a context
    variable), restoring the previous setting after."""
    token = _GEMM_ROWS.set(rows)
    try:
        yield
    finally:
        _GEMM_ROWS.reset(token)


def gemm_key(weight: torch.Tensor, x_dtype: torch.dtype, out_dtype: torch.dtype, bias: bool) -> tuple:
    """What a GEMM's kernel choice depends on besides its row count: ``(out, in,
    input dtype, weight dtype, output dtype, bias)``."""
    return (int(weight.shape[0]), int(weight.shape[1]), x_dtype, weight.dtype, out_dtype, bias)


def at_checked_rows(gemm: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, key: tuple) -> torch.Tensor:
    """``gemm(x)`` for ``x`` ``[T, in]``, inside :func:`checked_rows` run at the
    row count :class:`GemmRows` gives (zero rows appended, the first ``T`` rows
    returned); otherwise as is.

    Raises:
        ValueError: inside :func:`checked_rows`, ``x`` is not 2-D, or has more
            rows than were checked.
    """
    rows = _GEMM_ROWS.get()
    if rows is None:
        return gemm(x)
    if x.dim() != 2:
        raise ValueError(f"deterministic mode runs GEMMs on [rows, features] inputs, not {tuple(x.shape)}")
    t = x.shape[0]
    # A contiguous input: cuBLAS picks its kernel by the strides and alignment too.
    x = x.contiguous()
    n = rows.rows(t, key)
    if n == t:
        return gemm(x)
    return gemm(F.pad(x, (0, 0, 0, n - t)))[:t]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``: ``x`` ``[T, in]``, ``weight`` ``[out, in]`` -> ``[T, out]``
    in ``x.dtype``, row-invariant on CPU (see the module docstring) and on the
    GPU in deterministic mode."""
    if x.device.type == "cpu" and x.is_floating_point():
        return F.linear(x.double(), weight.double(), None if bias is None else bias.double()).to(x.dtype)
    if _GEMM_ROWS.get() is not None:
        return at_checked_rows(lambda a: F.linear(a, weight, bias), x,
                               gemm_key(weight, x.dtype, x.dtype, bias is not None))
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
