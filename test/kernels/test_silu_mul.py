"""The fused ``silu(gate) * up`` kernel under the Triton interpreter
(``TRITON_INTERPRET=1``, set by conftest.py) against its PyTorch reference, the
reference against torch's two ops, and the gated MLP that uses it."""

import os
from functools import partial

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flide_ext.kernels.silu_mul import silu_mul, silu_mul_ref  # noqa: E402
from flide_ext.kernels.silu_mul.kernel import silu_mul_triton  # noqa: E402


def _halves(T, I, dtype, seed):
    # The gate and up halves of one [T, 2I] projection: rows at stride 2I.
    gen = torch.Generator().manual_seed(seed)
    gu = (4 * torch.randn(T, 2 * I, generator=gen)).to(dtype)
    return gu[:, :I], gu[:, I:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_rounds_as_torch(dtype):
    gate, up = _halves(33, 70, dtype, 1)
    want = F.silu(gate.contiguous()) * up.contiguous()
    got = silu_mul_ref(gate, up)
    assert got.dtype == dtype and got.is_contiguous()
    if dtype == torch.bfloat16:
        # torch computes a bf16 SiLU in float32 and rounds, then the product: the
        # reference's roundings, and float32's error is far below a bf16 ulp.
        assert torch.equal(got, want)
    else:
        # float32: torch's SiLU is within an ulp of the correctly rounded one
        # (two after the product); fp16: its float32 SiLU rounded again to fp16
        # (a double rounding) is an ulp off the once-rounded value now and then.
        rtol = 2 ** -22 if dtype == torch.float32 else 2 ** -10
        torch.testing.assert_close(got, want, rtol=rtol, atol=1e-30)
        if dtype == torch.float16:
            assert (got != want).float().mean() < 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,I", [(5, 70), (1, 1024), (3, 1500), (17, 8)])
def test_triton_matches_reference(dtype, T, I):
    gate, up = _halves(T, I, dtype, T * I)
    got = silu_mul_triton(gate, up)
    want = silu_mul_ref(gate, up)
    assert got.shape == (T, I) and got.dtype == dtype and got.is_contiguous()
    # bf16: the interpreter truncates float32 to bf16 where the GPU rounds to
    # nearest even, twice here: two bf16 ulps (benchmark/kernels/check_kernels.py
    # holds the GPU to two, as for the norms).
    tol = dict(rtol=1e-6, atol=1e-30) if dtype == torch.float32 else dict(rtol=2 ** -6, atol=1e-30)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_triton_extremes_and_layouts():
    big = torch.tensor([[-1e4, -100.0, -20.0, -1e-8, 0.0, 1e-8, 20.0, 100.0, 1e4, float("inf"), float("-inf"),
                         float("nan")]])
    up = torch.full_like(big, 3.0)
    got, want = silu_mul_triton(big, up), silu_mul_ref(big, up)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-30, equal_nan=True)
    # Columns not dense (a transposed view) are copied; empty inputs give empty outputs.
    gen = torch.Generator().manual_seed(9)
    g, u = torch.randn(6, 4, generator=gen).t(), torch.randn(4, 6, generator=gen)
    torch.testing.assert_close(silu_mul_triton(g, u), silu_mul_ref(g, u), rtol=1e-6, atol=1e-30)
    assert silu_mul_triton(torch.empty(0, 5), torch.empty(0, 5)).shape == (0, 5)


def test_refuses_bad_arguments():
    x = torch.randn(3, 8)
    for fn in (partial(silu_mul, backend="reference"), partial(silu_mul, backend="triton")):
        with pytest.raises(ValueError, match="must both be"):
            fn(x, x[:2])
        with pytest.raises(ValueError, match="must both be"):
            fn(x[0], x[0])
        with pytest.raises(ValueError, match="dtype"):
            fn(x, x.double())
    with pytest.raises(ValueError, match="float32, bfloat16, float16"):
        silu_mul_triton(x.double(), x.double())


def test_dispatch_and_the_gated_mlp():
    from flide_ext.layers.mlp import GatedMLP

    gate, up = _halves(4, 24, torch.float32, 3)
    assert torch.equal(silu_mul(gate, up), silu_mul_ref(gate, up))
    torch.manual_seed(0)
    mlp = GatedMLP(16, 24, "silu")
    x = torch.randn(5, 16)
    with torch.no_grad():
        plain = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    with torch.inference_mode():
        fused = mlp(x)
        assert torch.equal(silu_mul(gate.double(), up.double(), "triton"), silu_mul_ref(gate.double(), up.double()))
        mlp.backend = "triton"
        triton_mlp = mlp(x)
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(triton_mlp, fused, rtol=1e-6, atol=1e-7)
    # Another activation keeps torch's two ops.
    gelu = GatedMLP(16, 24, "gelu")
    with torch.no_grad():
        want = gelu.down_proj(F.gelu(gelu.gate_proj(x)) * gelu.up_proj(x))
    with torch.inference_mode():
        torch.testing.assert_close(gelu(x), want, rtol=1e-6, atol=1e-7)


def test_refuses_integer_inputs():
    x = torch.ones(2, 3, dtype=torch.int32)
    for backend in ("reference", "triton"):
        with pytest.raises(ValueError, match="floating-point"):
            silu_mul(x, x, backend)
