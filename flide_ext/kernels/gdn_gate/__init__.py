"""The Gated DeltaNet gates: the public function (argument checks and
dispatch); reference in :mod:`.reference`, kernel in :mod:`.kernel`."""

from __future__ import annotations

from typing import Optional

import torch

from ..arguments import float32_math_dtypes
from ..dispatch import backend_for, checked_reference
from . import reference

__all__ = ["gdn_gate", "gdn_gate_ref"]


def _check(a, b, A_log, dt_bias) -> None:
    if a.dim() != 2 or a.shape != b.shape:
        raise ValueError(f"gdn_gate: a {tuple(a.shape)} and b {tuple(b.shape)} must both be [T, HV]")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if t.shape != (a.shape[1],):
            raise ValueError(f"gdn_gate: {name} shape {tuple(t.shape)} is not [{a.shape[1]}]")


def gdn_gate(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
             backend: Optional[str] = None):
    """:func:`~.reference.gdn_gate_ref`'s contract; with ``backend`` ``"triton"`` (or
    None on CUDA) the Triton kernel (float32 math) for float32, bfloat16 or float16
    ``a`` and ``b`` (float64 takes the reference).

    Raises:
        ValueError: ``a`` and ``b`` not both ``[T, HV]``; ``A_log`` or ``dt_bias`` not ``[HV]``.
    """
    _check(a, b, A_log, dt_bias)
    if backend_for(a, backend) == "triton" and float32_math_dtypes(a, b):
        from .kernel import gdn_gate_triton

        return gdn_gate_triton(a, b, A_log, dt_bias)
    return reference.gdn_gate_ref(a, b, A_log, dt_bias)


gdn_gate_ref = checked_reference(gdn_gate, reference.gdn_gate_ref)
