"""Triton ``silu(gate) * up``: :func:`flide_ext.kernels.silu_mul.silu_mul_ref` in
float32 with the reference's two roundings, one launch over ``[T, I]``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..arguments import check_float32_math_dtypes

BLOCK = 1024  # columns of one program


@triton.jit
def _silu_mul_kernel(GATE, UP, OUT, I, stride_gate, stride_up, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < I
    g = tl.load(GATE + row * stride_gate + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(UP + row * stride_up + cols, mask=ok, other=0.0).to(tl.float32)
    # The SiLU is rounded to the input dtype before the product, as torch's two ops do.
    s = (g * tl.sigmoid(g)).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * I + cols, (s * u).to(OUT.dtype.element_ty), mask=ok)


def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:func:`flide_ext.kernels.silu_mul.silu_mul_ref`'s contract; rows may lie at
    any stride (the halves of one ``[T, 2I]`` projection), columns dense or copied.

    Raises:
        ValueError: a dtype other than float32, bfloat16 or float16.
    """
    check_float32_math_dtypes("silu_mul_triton", gate=gate, up=up)
    T, I = gate.shape
    out = torch.empty(T, I, dtype=gate.dtype, device=gate.device)
    if T == 0 or I == 0:
        return out
    if gate.stride(1) != 1:
        gate = gate.contiguous()
    if up.stride(1) != 1:
        up = up.contiguous()
    _silu_mul_kernel[(T, triton.cdiv(I, BLOCK))](gate, up, out, I, gate.stride(0), up.stride(0), BLOCK=BLOCK,
                                                 num_warps=4)
    return out
