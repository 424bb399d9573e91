"""Triton ``x * sigmoid(gate)`` per head: :func:`flide_ext.kernels.sigmoid_mul.sigmoid_mul_ref`
in float32 with the reference's two roundings, one launch over ``[T, H, D]``,
reading the gate where the query projection left it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..arguments import check_float32_math_dtypes

ELEMENTS_PER_PROGRAM = 4096  # (token, head) rows of one program: this many elements at most


@triton.jit
def _sigmoid_mul_kernel(X, GATE, OUT, N, H, D, stride_xt, stride_xh, stride_gt, stride_gh,
                        ROWS: tl.constexpr, BD: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # (token, head) pairs
    cols = tl.arange(0, BD)
    t, h = rows // H, rows % H
    mask = (rows < N)[:, None] & (cols < D)[None, :]
    x = tl.load(X + (t * stride_xt + h * stride_xh)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + (t * stride_gt + h * stride_gh)[:, None] + cols[None, :], mask=mask, other=0.0)
    # The sigmoid is rounded to the input dtype before the product, as torch's two ops do.
    s = tl.sigmoid(g.to(tl.float32)).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + rows[:, None] * D + cols[None, :], (x * s).to(OUT.dtype.element_ty), mask=mask)


def sigmoid_mul_triton(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """:func:`flide_ext.kernels.sigmoid_mul.sigmoid_mul_ref`'s contract; ``x`` and
    ``gate`` may lie at any token and head strides (columns dense, or copied).

    Raises:
        ValueError: a dtype other than float32, bfloat16 or float16.
    """
    check_float32_math_dtypes("sigmoid_mul_triton", x=x, gate=gate)
    T, H, D = x.shape
    out = torch.empty(T, H * D, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    if x.stride(2) != 1:
        x = x.contiguous()
    if gate.stride(2) != 1:
        gate = gate.contiguous()
    BD = triton.next_power_of_2(D)
    rows = max(1, min(16, ELEMENTS_PER_PROGRAM // BD))
    _sigmoid_mul_kernel[(triton.cdiv(T * H, rows),)](
        x, gate, out, T * H, H, D, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
        ROWS=rows, BD=BD, num_warps=4 if rows * BD <= 2048 else 8,
    )
    return out
