"""RMSNorm over the last dimension (Zhang & Sennrich, 2019, "Root Mean Square Layer
Normalization"), in the three roundings the supported checkpoints use, with an
optional SiLU gate; one Triton launch per call on the GPU.

* ``"cast"`` (Llama, Qwen3): ``w * (x * rstd).to(dtype)``, the product rounded again.
* ``"offset"`` (Qwen3.5 / Qwen3-Next, weights stored as offsets from 1):
  ``(x * rstd * (1 + w)).to(dtype)``, all in float32.
* ``"cast"`` with ``gate`` (the Qwen3.5 GDN output norm):
  ``((w * (x * rstd).to(dtype)).float() * silu(gate.float())).to(dtype)``.

with ``rstd = 1 / sqrt(mean(x.float()^2) + eps)``. Each of those is the Hugging Face
module's own order of roundings (``LlamaRMSNorm``, ``Qwen3_5RMSNorm``,
``Qwen3_5RMSNormGated`` in transformers), so a bf16 run rounds where the checkpoint's
reference does; unfused, a norm is about nine element-wise launches, which in a
flat CUDA graph of a few hundred rows cost more than the norm's arithmetic.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .arguments import float32_math_dtypes
from .dispatch import use_triton

MODES = ("cast", "offset")
MAX_TRITON_WIDTH = 16384  # elements of one row the kernel holds at once


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, mode: str = "cast",
                 gate: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None):
    """Plain PyTorch reference.

    Args:
        x: ``[..., D]`` float tensor (any strides).
        weight: ``[D]`` scale (``"cast"``) or offset from 1 (``"offset"``).
        eps: added to the mean square.
        mode: ``"cast"`` or ``"offset"`` (module docstring).
        gate: ``[..., D]`` like ``x``, or None; only with ``"cast"``.
        residual: ``[..., D]`` like ``x`` (shape and dtype), or None: the
            pre-norm decoder's residual stream. Then the norm is of ``x +
            residual`` (rounded to ``x.dtype``, as torch's add), which is also
            returned, for the next layer.

    Returns:
        ``[..., D]`` in ``x.dtype`` (``"cast"`` without gate: in the promotion
        of ``weight.dtype`` and ``x.dtype``, as the modules); with ``residual``
        the pair ``(normalised, x + residual)``.

    Raises:
        ValueError: an unknown mode, a gate with ``"offset"`` or with a
            residual, or shapes or dtypes that differ.
    """
    _check(x, weight, mode, gate, residual)
    if residual is not None:
        total = x + residual
        return rms_norm_ref(total, weight, eps, mode), total
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if mode == "offset":
        return (h * (1.0 + weight.float())).to(dtype)
    h = weight * h.to(dtype)
    if gate is None:
        return h
    return (h * F.silu(gate.float())).to(dtype)


def _check(x, weight, mode, gate, residual=None) -> None:
    if x.dim() == 0:
        raise ValueError("rms_norm: x must have at least one dimension (the normalised one)")
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
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"rms_norm residual {tuple(residual.shape)} {residual.dtype} differs from x's "
                             f"{tuple(x.shape)} {x.dtype}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, mode: str = "cast",
             gate: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None):
    """:func:`rms_norm_ref`'s contract; the Triton kernel on CUDA tensors of
    float32, bfloat16 or float16 whose rows are at most ``MAX_TRITON_WIDTH`` wide (a program
    holds a whole row; wider rows, wider than any supported model's, and float64
    take the reference). With ``residual`` the add is in the same launch."""
    if use_triton(x) and x.shape[-1] <= MAX_TRITON_WIDTH and float32_math_dtypes(x, weight, gate, residual):
        from .rms_norm_triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps, mode, gate, residual)
    return rms_norm_ref(x, weight, eps, mode, gate, residual)
