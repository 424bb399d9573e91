"""The two ceilings a kernel is measured against, taken in the same run
(METHOD.md): bf16 matrix-product rate and device-to-device copy bandwidth."""

from __future__ import annotations

import torch
import triton.testing


def matmul_tflops(n: int = 8192) -> float:
    """bf16 ``n x n x n`` matrix product through PyTorch on random data, TFLOP/s (median)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    return 2 * n**3 / (ms * 1e-3) / 1e12


def copy_gbps(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, GB/s counting bytes read plus bytes written (median)."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9
