"""Triton Gated DeltaNet gates: :func:`flide_ext.kernels.gdn_gate.gdn_gate_ref` in
float32, one launch over all ``T x HV`` values."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gdn_gate import _check

BLOCK = 1024


@triton.jit
def _gdn_gate_kernel(A, B, A_LOG, DT_BIAS, G, BETA, N, HV, stride_a, stride_b, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < N
    t, h = i // HV, i % HV
    a = tl.load(A + t * stride_a + h, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(B + t * stride_b + h, mask=ok, other=0.0).to(tl.float32)
    x = a + tl.load(DT_BIAS + h, mask=ok, other=0.0).to(tl.float32)
    # softplus = max(x, 0) + log(1 + e), e = exp(-|x|) (torch: linear above 20);
    # log(1 + e) by its series where 1 + e would round e away in float32.
    e = tl.exp(-tl.abs(x))
    softplus = tl.maximum(x, 0.0) + tl.where(e < 1e-4, e * (1.0 - 0.5 * e), tl.log(1.0 + e))
    softplus = tl.where(x > 20.0, x, softplus)
    g = -tl.exp(tl.load(A_LOG + h, mask=ok, other=0.0).to(tl.float32)) * softplus
    tl.store(G + i, g, mask=ok)
    tl.store(BETA + i, tl.cast(tl.sigmoid(b), BETA.dtype.element_ty, fp_downcast_rounding="rtne"), mask=ok)


def gdn_gate_triton(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """:func:`flide_ext.kernels.gdn_gate.gdn_gate_ref`'s contract."""
    _check(a, b, A_log, dt_bias)
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
