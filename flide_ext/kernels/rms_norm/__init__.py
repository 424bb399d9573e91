"""RMSNorm over the last dimension, one Triton launch on the GPU: the public
function (argument checks and dispatch). The formulas and their roundings are in
:mod:`.reference`; the kernel is :mod:`.kernel`."""

from __future__ import annotations

from typing import Optional

import torch

from ..arguments import float32_math_dtypes
from ..dispatch import backend_for, checked_reference
from . import reference
from .reference import MODES

__all__ = ["MAX_TRITON_WIDTH", "MODES", "rms_norm", "rms_norm_ref"]

MAX_TRITON_WIDTH = 16384  # elements of one row the kernel holds at once


def _check(x, weight, mode, gate, residual=None, valid=None) -> None:
    if x.dim() == 0:
        raise ValueError("rms_norm: x must have at least one dimension (the normalised one)")
    if valid is not None and (x.dim() < 2 or valid.dtype != torch.bool or valid.shape != x.shape[:1]):
        raise ValueError(f"rms_norm valid {tuple(valid.shape)} {valid.dtype} must be a bool [{x.shape[0]}] over x's "
                         f"first dimension (x {tuple(x.shape)}, at least 2-D)")
    if mode not in MODES:
        raise ValueError(f"rms_norm mode {mode!r} is not one of {', '.join(MODES)}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"rms_norm weight shape {tuple(weight.shape)} does not match x's last dim {x.shape[-1]}")
    if gate is not None:
        if mode != "cast":
            raise ValueError("rms_norm: a gate is only supported with mode 'cast'")
        if gate.shape != x.shape:
            raise ValueError(f"rms_norm gate shape {tuple(gate.shape)} differs from x's {tuple(x.shape)}")
    if residual is not None:
        if gate is not None:
            raise ValueError("rms_norm: a residual is not supported with a gate")
        wider = residual.dtype == torch.float32 and x.dtype in (torch.bfloat16, torch.float16)
        if residual.shape != x.shape or not (residual.dtype == x.dtype or wider):
            raise ValueError(f"rms_norm residual {tuple(residual.shape)} {residual.dtype} differs from x's "
                             f"{tuple(x.shape)} {x.dtype} (a residual is in x's dtype, or float32 beside "
                             "bf16 / fp16 rows)")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, mode: str = "cast",
             gate: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
             valid: Optional[torch.Tensor] = None, backend: Optional[str] = None):
    """:func:`~.reference.rms_norm_ref`'s contract (arguments, shapes, result).

    ``backend`` (:mod:`flide_ext.kernels.dispatch`): the Triton kernel runs for
    float32, bfloat16 or float16 rows at most ``MAX_TRITON_WIDTH`` wide (a program
    holds a whole row; wider rows, wider than any supported model's, and float64
    take the reference). With ``residual`` the add is in the same launch.

    Raises:
        ValueError: an unknown mode, a gate with a mode other than ``"cast"`` or with a residual,
            shapes that differ, a residual neither in ``x.dtype`` nor float32
            beside bf16 / fp16 ``x``,
            a 0-dim ``x``, a ``valid`` that is not a bool ``[x.shape[0]]`` over an
            at least 2-D ``x``.
    """
    _check(x, weight, mode, gate, residual, valid)
    if (backend_for(x, backend) == "triton" and x.shape[-1] <= MAX_TRITON_WIDTH
            and float32_math_dtypes(x, weight, gate, residual)):
        from .kernel import rms_norm_triton

        return rms_norm_triton(x, weight, eps, mode, gate, residual, valid)
    return reference.rms_norm_ref(x, weight, eps, mode, gate, residual, valid)


rms_norm_ref = checked_reference(rms_norm, reference.rms_norm_ref)
