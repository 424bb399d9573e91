"""Gated attention's fused ``x * sigmoid(gate)`` kernel under the Triton
interpreter (``TRITON_INTERPRET=1``, set by conftest.py) against its PyTorch
reference, and the reference against torch's own ops (the Hugging Face
attention's ``attn_output * torch.sigmoid(gate)``)."""

import os
from functools import partial

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flide_ext.kernels.sigmoid_mul import sigmoid_mul, sigmoid_mul_ref  # noqa: E402
from flide_ext.kernels.sigmoid_mul.kernel import sigmoid_mul_triton  # noqa: E402


def _query_and_gate(T, H, D, dtype, seed):
    # The attention output [T, H, D] and the gate halves of a [T, H, 2D] query projection.
    gen = torch.Generator().manual_seed(seed)
    x = (2 * torch.randn(T, H, D, generator=gen)).to(dtype)
    qg = (4 * torch.randn(T, H, 2 * D, generator=gen)).to(dtype)
    return x, qg[..., D:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_rounds_as_torch(dtype):
    x, gate = _query_and_gate(9, 3, 20, dtype, 1)
    want = (x.reshape(9, -1) * torch.sigmoid(gate.reshape(9, -1)))
    got = sigmoid_mul_ref(x, gate)
    assert got.shape == (9, 60) and got.dtype == dtype and got.is_contiguous()
    if dtype == torch.bfloat16:
        # torch's bf16 sigmoid is float32 math rounded once, then the product: the
        # reference's roundings; float32's error is far below a bf16 ulp.
        assert torch.equal(got, want)
    else:
        # float32: torch's sigmoid within an ulp of the correctly rounded one (two
        # after the product); fp16: a double rounding now and then.
        rtol = 2 ** -22 if dtype == torch.float32 else 2 ** -10
        torch.testing.assert_close(got, want, rtol=rtol, atol=1e-30)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,H,D", [(5, 3, 20), (1, 16, 256), (17, 2, 128), (3, 1, 7)])
def test_triton_matches_reference(dtype, T, H, D):
    x, gate = _query_and_gate(T, H, D, dtype, T * H * D)
    got = sigmoid_mul_triton(x, gate)
    want = sigmoid_mul_ref(x, gate)
    assert got.shape == (T, H * D) and got.dtype == dtype and got.is_contiguous()
    # bf16: the interpreter truncates float32 to bf16 where the GPU rounds to
    # nearest even, twice here: two bf16 ulps, as for silu_mul.
    tol = dict(rtol=1e-6, atol=1e-30) if dtype == torch.float32 else dict(rtol=2 ** -6, atol=1e-30)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_triton_extremes_and_layouts():
    g = torch.tensor([-1e4, -100.0, -20.0, -1e-8, 0.0, 1e-8, 20.0, 100.0, 1e4, float("inf"), float("-inf"),
                      float("nan")]).reshape(1, 2, 6)
    x = torch.full_like(g, 3.0)
    torch.testing.assert_close(sigmoid_mul_triton(x, g), sigmoid_mul_ref(x, g), rtol=1e-6, atol=1e-30,
                               equal_nan=True)
    # Columns not dense (a transposed view) are copied; empty inputs give empty outputs.
    gen = torch.Generator().manual_seed(9)
    a, b = torch.randn(5, 3, 4, generator=gen), torch.randn(5, 4, 3, generator=gen).transpose(1, 2)
    torch.testing.assert_close(sigmoid_mul_triton(a, b), sigmoid_mul_ref(a, b), rtol=1e-6, atol=1e-30)
    assert sigmoid_mul_triton(torch.empty(0, 2, 5), torch.empty(0, 2, 5)).shape == (0, 10)


def test_refuses_bad_arguments():
    x = torch.randn(3, 2, 8)
    for fn in (partial(sigmoid_mul, backend="reference"), partial(sigmoid_mul, backend="triton")):
        with pytest.raises(ValueError, match="must both be"):
            fn(x, x[:2])
        with pytest.raises(ValueError, match="must both be"):
            fn(x[0], x[0])
        with pytest.raises(ValueError, match="dtype"):
            fn(x, x.double())
        with pytest.raises(ValueError, match="floating"):
            fn(x.int(), x.int())


def test_reference_edges_agree_with_torch_and_the_kernel():
    # Below -ln(FLT_MAX) float32's exp overflows and its sigmoid is 0, not a subnormal.
    g = torch.tensor([-89.0, -90.0, -200.0, -88.0]).reshape(1, 1, 4)
    x = torch.tensor([float("inf"), 3e38, 3e38, 3e38]).reshape(1, 1, 4)
    want = (x * torch.sigmoid(g)).reshape(1, 4)
    torch.testing.assert_close(sigmoid_mul_ref(x, g), want, rtol=2 ** -22, atol=0, equal_nan=True)
    torch.testing.assert_close(sigmoid_mul_triton(x, g), want, rtol=1e-6, atol=0, equal_nan=True)
    # No rows: an empty result on either path.
    for backend in ("reference", "triton"):
        assert sigmoid_mul(torch.empty(0, 2, 4), torch.empty(0, 2, 4), backend=backend).shape == (0, 8)


def test_heads_wider_than_a_program_take_the_reference(monkeypatch):
    from flide_ext.kernels.sigmoid_mul import MAX_TRITON_WIDTH

    calls = []
    monkeypatch.setattr("flide_ext.kernels.sigmoid_mul.kernel.sigmoid_mul_triton",
                        lambda *a: calls.append(a) or sigmoid_mul_ref(*a))
    wide = torch.randn(1, 1, MAX_TRITON_WIDTH + 1)
    assert torch.equal(sigmoid_mul(wide, wide, backend="triton"), sigmoid_mul_ref(wide, wide)) and not calls
    sigmoid_mul(wide[..., :8], wide[..., :8], backend="triton")
    assert len(calls) == 1
