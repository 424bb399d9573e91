"""Triton RMSNorm: a block of rows per program, every rounding of
:func:`flide_ext.kernels.rms_norm.rms_norm_ref` in the same place.

No autotuning: the block shape follows from the row width alone, so a flat graph's
capture compiles each norm once (an autotuned kernel keyed on the row count would
tune again for every graph capacity).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..arguments import check_float32_math_dtypes

ELEMENTS_PER_PROGRAM = 4096  # rows of a narrow norm (per-head q/k, GDN output) share a program
MODE_CODES = {"cast": 0, "offset": 1, "scale": 2}  # the kernel's MODE, per mode of the reference


@triton.jit
def _round(x, dtype: tl.constexpr):
    """``x`` (float32) rounded to ``dtype`` (to nearest even on the GPU, as torch casts), back in float32."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _rms_norm_kernel(X, W, GATE, Y, RES, SUM, VALID, N, D, stride_x, stride_gate, stride_res, eps, GROUP,
                     ROWS: tl.constexpr, BD: tl.constexpr, MODE: tl.constexpr, HAS_GATE: tl.constexpr,
                     ROUND_MID: tl.constexpr, HAS_RES: tl.constexpr, HAS_VALID: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    row_ok = rows < N
    col_ok = cols < D
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        # The residual stream's add, rounded to the stream's dtype as torch's add is
        # (not at all for a float32 stream).
        r = tl.load(RES + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = _round(x + r, SUM.dtype.element_ty)
        tl.store(SUM + rows[:, None] * D + cols[None, :], x.to(SUM.dtype.element_ty), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    h = x * rstd[:, None]
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    if MODE == 1:  # "offset"
        y = h * (1.0 + w)[None, :]
    elif MODE == 2:  # "scale"
        y = h * w[None, :]
    else:
        # The normalised row is rounded to the input dtype before the scale, and the
        # product to the promoted dtype (ROUND_MID: the input's), as the modules do.
        y = _round(h, X.dtype.element_ty) * w[None, :]
        if HAS_GATE:
            if ROUND_MID:
                y = _round(y, X.dtype.element_ty)
            z = tl.load(GATE + rows[:, None] * stride_gate + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            y = y * (z * tl.sigmoid(z))
    if HAS_VALID:
        # A select, not a product: a row left undefined (NaN, say) comes out zero.
        keep = tl.load(VALID + rows // GROUP, mask=row_ok, other=0) != 0
        y = tl.where(keep[:, None], y, 0.0)
    tl.store(Y + rows[:, None] * D + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


def as_rows(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``t`` ``[..., D]`` as rows of D: ``(tensor, row stride in elements)``, without
    a copy when the rows lie at one stride (a head-split view of a projection, say)."""
    D = t.shape[-1]
    if t.stride(-1) != 1 and D > 1:
        t = t.contiguous()
    if t.dim() == 1:
        return t, D
    uniform = all(t.stride(i) == t.stride(i + 1) * t.shape[i + 1] for i in range(t.dim() - 2))
    if not uniform:
        t = t.contiguous()
    return t, t.stride(-2)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, mode: str = "cast",
                    gate: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
                    valid: Optional[torch.Tensor] = None):
    """:func:`flide_ext.kernels.rms_norm.rms_norm_ref` in one launch (the residual
    add and the zeroing of rows not ``valid`` included); outputs contiguous.

    Raises:
        ValueError: a dtype other than float32, bfloat16 or float16 (the kernel
            computes in float32). Other arguments are checked by the public function.
    """
    check_float32_math_dtypes("rms_norm_triton", x=x, weight=weight, gate=gate, residual=residual)
    weight = weight.contiguous()
    D = x.shape[-1]
    N = x.numel() // D if D else 0
    promoted = torch.promote_types(weight.dtype, x.dtype)
    dtype = x.dtype if (mode != "cast" or gate is not None) else promoted
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    total = torch.empty(x.shape, dtype=residual.dtype, device=x.device) if residual is not None else None
    if N == 0:
        return y if residual is None else (y, total)
    x_rows, stride_x = as_rows(x)
    gate_rows, stride_gate = as_rows(gate) if gate is not None else (x_rows, stride_x)
    res_rows, stride_res = as_rows(residual) if residual is not None else (x_rows, stride_x)
    BD = triton.next_power_of_2(D)
    rows = max(1, min(16, ELEMENTS_PER_PROGRAM // BD))
    if valid is not None:
        valid = valid.contiguous()
    _rms_norm_kernel[(triton.cdiv(N, rows),)](
        x_rows, weight, gate_rows, y, res_rows, total if total is not None else y,
        valid if valid is not None else weight, N, D, stride_x, stride_gate, stride_res, float(eps),
        N // x.shape[0] if valid is not None else 1,
        ROWS=rows, BD=BD, MODE=MODE_CODES[mode], HAS_GATE=gate is not None, ROUND_MID=promoted == x.dtype,
        HAS_RES=residual is not None, HAS_VALID=valid is not None, num_warps=4 if rows * BD <= 2048 else 8,
    )
    return y if residual is None else (y, total)
