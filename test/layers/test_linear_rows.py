"""The CPU GEMM of Flide's Linear gives a row the same bits alone and among
other rows, in every float dtype (it accumulates in float64 and rounds once)."""

import pytest
import torch

from flide_ext.layers.linear import linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_a_row_alone_equals_the_row_in_a_batch(dtype, bias):
    gen = torch.Generator().manual_seed(0)
    # A shape at which the plain CPU GEMM gives some bf16 rows other bits alone.
    x = torch.randn(300, 1024, generator=gen).to(dtype)
    w = (torch.randn(1024, 1024, generator=gen) / 32).to(dtype)
    b = torch.randn(1024, generator=gen).to(dtype) if bias else None
    batch = linear(x, w, b)
    assert batch.dtype == dtype
    for i in range(0, 300, 13):
        assert torch.equal(linear(x[i:i + 1], w, b)[0], batch[i]), i
    for n in (7, 64, 257):
        assert torch.equal(linear(x[:n], w, b), batch[:n]), n
    # One rounding of the exact product: as close to float64 as the dtype allows.
    exact = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    assert torch.equal(batch, exact.to(dtype))
