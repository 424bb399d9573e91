"""RMSNorm over the last dimension (Zhang & Sennrich, 2019, "Root Mean Square Layer
Normalization"), in the roundings the supported checkpoints use, with an
optional SiLU gate; one Triton launch per call on the GPU.

* ``"cast"`` (Llama, Qwen3): ``w * (x * rstd).to(dtype)``, the product rounded again.
* ``"offset"`` (Qwen3.5 / Qwen3-Next, weights stored as offsets from 1):
  ``(x * rstd * (1 + w)).to(dtype)``, all in float32.
* ``"scale"`` (Gemma 4, weights stored as the scale itself): ``(x * rstd * w).to(dtype)``,
  all in float32.
* ``"cast"`` with ``gate`` (the Qwen3.5 GDN output norm):
  ``((w * (x * rstd).to(dtype)).float() * silu(gate.float())).to(dtype)``.

with ``rstd = 1 / sqrt(mean(x.float()^2) + eps)``. Each of those is the Hugging Face
module's own order of roundings (``LlamaRMSNorm``, ``Qwen3_5RMSNorm``,
``Qwen3_5RMSNormGated``, ``Gemma4RMSNorm`` in transformers), so a bf16 run rounds where the checkpoint's
reference does; unfused, a norm is about nine element-wise launches, which in a
flat CUDA graph of a few hundred rows cost more than the norm's arithmetic.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


MODES = ("cast", "offset", "scale")


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, mode: str = "cast",
                 gate: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
                 valid: Optional[torch.Tensor] = None):
    """Plain PyTorch reference.

    Args:
        x: ``[..., D]`` float tensor (any strides).
        weight: ``[D]`` scale (``"cast"``, ``"scale"``) or offset from 1 (``"offset"``).
        eps: added to the mean square.
        mode: ``"cast"``, ``"offset"`` or ``"scale"`` (module docstring).
        gate: ``[..., D]`` like ``x``, or None; only with ``"cast"``.
        residual: ``[..., D]`` like ``x``, in ``x.dtype`` (or float32 beside bf16 /
            fp16 ``x``), or None:
            the pre-norm decoder's residual stream. Then the norm is of ``x +
            residual`` (in the residual's dtype, as torch's add: a float32
            stream is never rounded to ``x.dtype``), which is also returned,
            for the next layer; the normalised output rounds as for ``x``.
        valid: ``[x.shape[0]]`` bool, or None: where False, that entry's rows of
            the normalised output are zeros, whatever ``x`` and ``gate`` hold
            there (NaN included): a flat graph's rows past its round, which
            the GDN pass leaves undefined.

    Returns:
        ``[..., D]`` in ``x.dtype`` (``"cast"`` without gate: in the promotion
        of ``weight.dtype`` and ``x.dtype``, as the modules); with ``residual``
        the pair ``(normalised, x + residual)``.

    Arguments are checked by :func:`flide_ext.kernels.rms_norm.rms_norm`.
    """
    if residual is not None:
        total = x + residual
        return _kept(_normalised(total, weight, eps, mode, None, x.dtype), valid), total
    return _kept(_normalised(x, weight, eps, mode, gate, x.dtype), valid)


def _kept(y: torch.Tensor, valid: Optional[torch.Tensor]) -> torch.Tensor:
    if valid is None:
        return y
    return torch.where(valid.reshape(-1, *[1] * (y.dim() - 1)), y, torch.zeros((), dtype=y.dtype))


def _normalised(x, weight, eps, mode, gate, dtype):
    # ``dtype``: where the formulas round (the input's, or the block output's
    # beside a float32 residual stream).
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if mode == "offset":
        return (h * (1.0 + weight.float())).to(dtype)
    if mode == "scale":
        return (h * weight.float()).to(dtype)
    h = weight * h.to(dtype)
    if gate is None:
        return h
    return (h * F.silu(gate.float())).to(dtype)
