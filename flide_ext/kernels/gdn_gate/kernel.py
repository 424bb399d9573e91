"""Triton Gated DeltaNet gates: :func:`flide_ext.kernels.gdn_gate.gdn_gate_ref` in
float32, one launch over all ``T x HV`` values."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..arguments import check_float32_math_dtypes

BLOCK = 1024


@triton.jit
def _gdn_gate_kernel(A, B, A_LOG, DT_BIAS, G, BETA, N, HV, stride_a, stride_b, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < N
    t, h = i // HV, i % HV
    a = tl.load(A + t * stride_a + h, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(B + t * stride_b + h, mask=ok, other=0.0).to(tl.float32)
    x = a + tl.load(DT_BIAS + h, mask=ok, other=0.0).to(tl.float32)
    # softplus = max(x, 0) + log1p(e), e = exp(-|x|) (torch: linear above 20).
    # log1p(e) = log(u) * e / (u - 1) with u = 1 + e rounded, which cancels u's
    # rounding error (Goldberg, 1991, "What every computer scientist should know
    # about floating-point arithmetic", Theorem 4); e itself where u rounds to 1.
    e = tl.exp(-tl.abs(x))
    u = 1.0 + e
    log1p = tl.where(u == 1.0, e, tl.log(u) * e / tl.where(u == 1.0, 1.0, u - 1.0))
    softplus = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)
    g = -tl.exp(tl.load(A_LOG + h, mask=ok, other=0.0).to(tl.float32)) * softplus
    tl.store(G + i, g, mask=ok)
    tl.store(BETA + i, tl.sigmoid(b).to(BETA.dtype.element_ty), mask=ok)


def gdn_gate_triton(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """:func:`flide_ext.kernels.gdn_gate.gdn_gate_ref`'s contract.

    Raises:
        ValueError: ``a``/``b`` not float32, bfloat16 or float16.
    """
    check_float32_math_dtypes("gdn_gate_triton", a=a, b=b)
    A_log, dt_bias = A_log.contiguous(), dt_bias.contiguous()
    T, HV = a.shape
    g = torch.empty(T, HV, dtype=torch.float32, device=a.device)
    beta = torch.empty(T, HV, dtype=b.dtype, device=b.device)
    if T == 0 or HV == 0:
        return g, beta
    if a.stride(1) != 1:
        a = a.contiguous()
    if b.stride(1) != 1:
        b = b.contiguous()
    _gdn_gate_kernel[(triton.cdiv(T * HV, BLOCK),)](a, b, A_log, dt_bias, g, beta, T * HV, HV, a.stride(0),
                                                    b.stride(0), BLOCK=BLOCK, num_warps=4)
    return g, beta
