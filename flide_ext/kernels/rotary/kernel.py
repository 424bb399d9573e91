"""Triton rotary embedding: :func:`flide_ext.kernels.rotary.rotary_ref` with one
program per token over all its heads."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..arguments import check_float32_math_dtypes


@triton.jit
def _product(x, y, dtype: tl.constexpr):
    """``x * y`` (float32) rounded to ``dtype`` to nearest even, back in float32.
    bfloat16 is rounded on the bits: on the H200 the compiled conversion round
    trip gave 16% of RoPE outputs off torch's by an ulp, the bit rounding none
    (``benchmark/results/kernels/probe_bf16_rounding.log``)."""
    p = x * y
    if dtype == tl.bfloat16:
        bits = p.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return p.to(dtype).to(tl.float32)


@triton.jit
def _rotary_kernel(X, COS, SIN, OUT, H, D, R, stride_xt, stride_xh, stride_cos, stride_sin,
                   BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
                   HAS_REST: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    half = R // 2
    h_ok = h < H
    ok = h_ok[:, None] & (j < half)[None, :]
    row = X + t * stride_xt + h[:, None] * stride_xh
    a = tl.load(row + j[None, :], mask=ok, other=0.0).to(tl.float32)  # first half
    b = tl.load(row + half + j[None, :], mask=ok, other=0.0).to(tl.float32)  # second half
    c1 = tl.load(COS + t * stride_cos + j, mask=j < half, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(COS + t * stride_cos + half + j, mask=j < half, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(SIN + t * stride_sin + j, mask=j < half, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(SIN + t * stride_sin + half + j, mask=j < half, other=0.0).to(tl.float32)[None, :]
    dtype = OUT.dtype.element_ty
    # Each product rounded to the output dtype, then the sum, as torch's ops do.
    first = _product(a, c1, dtype) + _product(-b, s1, dtype)
    second = _product(b, c2, dtype) + _product(a, s2, dtype)
    out = OUT + t * H * D + h[:, None] * D
    tl.store(out + j[None, :], first.to(dtype), mask=ok)
    tl.store(out + half + j[None, :], second.to(dtype), mask=ok)
    if HAS_REST:
        k = tl.arange(0, BLOCK_REST)
        keep = h_ok[:, None] & (R + k < D)[None, :]
        tl.store(out + R + k[None, :], tl.load(row + R + k[None, :], mask=keep, other=0.0), mask=keep)


def rotary_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`flide_ext.kernels.rotary.rotary_ref`'s contract; ``x`` may be any
    view whose features are dense (a head split of a projection), output contiguous.

    Raises:
        ValueError: a dtype other than float32, bfloat16 or float16.
    """
    check_float32_math_dtypes("rotary_triton", x=x)
    T, H, D = x.shape
    R = cos.shape[1]
    out = torch.empty(T, H, D, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    if x.stride(2) != 1:
        x = x.contiguous()
    if cos.stride(1) != 1:
        cos = cos.contiguous()
    if sin.stride(1) != 1:
        sin = sin.contiguous()
    _rotary_kernel[(T,)](x, cos, sin, out, H, D, R, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
                         BLOCK_H=triton.next_power_of_2(H), BLOCK_HALF=triton.next_power_of_2(max(R // 2, 1)),
                         BLOCK_REST=triton.next_power_of_2(max(D - R, 1)), HAS_REST=D > R, num_warps=4)
    return out
