"""The RMSNorm and GDN-gate Triton kernels under the Triton interpreter
(``TRITON_INTERPRET=1``, set by conftest.py) against their PyTorch references,
and the references against the Hugging Face modules they stand for."""

import os
from functools import partial

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flide_ext.kernels.gdn_gate import gdn_gate, gdn_gate_ref  # noqa: E402
from flide_ext.kernels.gdn_gate.kernel import gdn_gate_triton  # noqa: E402
from flide_ext.kernels.rms_norm import MAX_TRITON_WIDTH, rms_norm, rms_norm_ref  # noqa: E402
from flide_ext.kernels.rms_norm.kernel import as_rows, rms_norm_triton  # noqa: E402


def _hf_norms():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm, Qwen3_5RMSNormGated

    return LlamaRMSNorm, Qwen3_5RMSNorm, Qwen3_5RMSNormGated


def test_the_kernel_knows_every_mode():
    from flide_ext.kernels.rms_norm import MODES
    from flide_ext.kernels.rms_norm.kernel import MODE_CODES

    assert set(MODE_CODES) == set(MODES) and len(set(MODE_CODES.values())) == len(MODES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scale_mode_is_gemma4s_norm(dtype):
    from transformers.models.gemma4.modeling_gemma4 import Gemma4RMSNorm

    gen = torch.Generator().manual_seed(5)
    x = (3 * torch.randn(6, 2, 72, generator=gen)).to(dtype)
    w = (1 + 0.3 * torch.randn(72, generator=gen)).to(dtype)
    gemma = Gemma4RMSNorm(72, eps=1e-6).to(dtype)
    plain = Gemma4RMSNorm(72, eps=1e-6, with_scale=False)  # Gemma 4's v norm: no weight
    with torch.no_grad():
        gemma.weight.copy_(w)
    assert torch.equal(rms_norm_ref(x, w, 1e-6, "scale"), gemma(x))
    assert torch.equal(rms_norm_ref(x, torch.ones(72, dtype=dtype), 1e-6, "scale"), plain(x))
    # Not the other roundings: in bf16 the weight multiplies before the one rounding.
    if dtype == torch.bfloat16:
        assert not torch.equal(rms_norm_ref(x, w, 1e-6, "scale"), rms_norm_ref(x, w, 1e-6, "cast"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 96), (5, 3, 40), (1, 130)])
def test_reference_is_the_hf_modules(dtype, shape):
    LlamaRMSNorm, Qwen3_5RMSNorm, Qwen3_5RMSNormGated = _hf_norms()
    gen = torch.Generator().manual_seed(sum(shape))
    D = shape[-1]
    x = (3 * torch.randn(*shape, generator=gen)).to(dtype)
    z = torch.randn(*shape, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(D, generator=gen)).to(dtype)
    offset = (0.1 * torch.randn(D, generator=gen)).to(dtype)
    llama = LlamaRMSNorm(D, eps=1e-6).to(dtype)
    qwen = Qwen3_5RMSNorm(D, eps=1e-6).to(dtype)
    gated = Qwen3_5RMSNormGated(D, eps=1e-6).to(dtype)
    with torch.no_grad():
        llama.weight.copy_(w)
        qwen.weight.copy_(offset)
        gated.weight.copy_(w)
        assert torch.equal(rms_norm_ref(x, w, 1e-6, "cast"), llama(x))
        assert torch.equal(rms_norm_ref(x, offset, 1e-6, "offset"), qwen(x))
        assert torch.equal(rms_norm_ref(x, w, 1e-6, "cast", gate=z), gated(x, z))


@pytest.mark.parametrize("mode,gated", [("cast", False), ("offset", False), ("scale", False), ("cast", True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(9, 96), (4, 5, 24), (3, 130), (33, 8)])
def test_rms_norm_triton_matches_reference(mode, gated, dtype, shape):
    gen = torch.Generator().manual_seed(len(shape) * 1000 + shape[-1])
    x = (2 * torch.randn(*shape, generator=gen)).to(dtype)
    z = torch.randn(*shape, generator=gen).to(dtype) if gated else None
    w = (1 + 0.2 * torch.randn(shape[-1], generator=gen)).to(dtype)
    got = rms_norm_triton(x, w, 1e-6, mode, z)
    want = rms_norm_ref(x, w, 1e-6, mode, z)
    assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
    # bf16: the interpreter casts float32 to bf16 by truncation where the GPU (and
    # torch) round to nearest even, and a bf16 path rounds twice: four bf16 ulps.
    # The GPU check (benchmark/kernels/check_kernels.py) holds bf16 to two.
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -5, atol=2 ** -5)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_rms_norm_triton_strided_views_and_float32_weights():
    gen = torch.Generator().manual_seed(3)
    qg = torch.randn(6, 4, 2 * 32, generator=gen)
    q = qg.view(6, 4, 2, 32)[:, :, 0]  # the query half of a gated q_proj: rows at stride 64
    rows, stride = as_rows(q)
    assert stride == 64 and rows.data_ptr() == q.data_ptr()  # no copy
    w = 0.1 * torch.randn(32, generator=gen)
    torch.testing.assert_close(rms_norm_triton(q, w, 1e-6, "offset"), rms_norm_ref(q, w, 1e-6, "offset"),
                               rtol=1e-5, atol=1e-5)
    x = torch.randn(5, 3, 16, generator=gen).transpose(0, 1)  # rows not at one stride: copied
    torch.testing.assert_close(rms_norm_triton(x, w[:16], 1e-5), rms_norm_ref(x, w[:16], 1e-5), rtol=1e-5, atol=1e-5)
    # A float32 weight on bf16 rows promotes the ungated output to float32, as torch does.
    xb = torch.randn(4, 16, generator=gen).to(torch.bfloat16)
    got, want = rms_norm_triton(xb, w[:16], 1e-6), rms_norm_ref(xb, w[:16], 1e-6)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-5)  # one bf16 cast (truncated here)
    gz = torch.randn(4, 16, generator=gen).to(torch.bfloat16)
    got, want = rms_norm_triton(xb, w[:16], 1e-6, gate=gz), rms_norm_ref(xb, w[:16], 1e-6, gate=gz)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -5, atol=2 ** -5)


def test_rms_norm_refuses_bad_arguments():
    x = torch.randn(3, 8)
    for fn in (partial(rms_norm, backend="reference"), partial(rms_norm, backend="triton")):
        with pytest.raises(ValueError, match="mode"):
            fn(x, torch.ones(8), 1e-6, "layer")
        with pytest.raises(ValueError, match="weight shape"):
            fn(x, torch.ones(7), 1e-6)
        with pytest.raises(ValueError, match="gate"):
            fn(x, torch.ones(8), 1e-6, "offset", gate=x)
        with pytest.raises(ValueError, match="gate shape"):
            fn(x, torch.ones(8), 1e-6, "cast", gate=x[:2])
    assert rms_norm_triton(torch.empty(0, 8), torch.ones(8), 1e-6).shape == (0, 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_valid_rows_come_out_zero_whatever_they_hold(dtype):
    # A graph's rows past its round: the GDN pass leaves them undefined (NaN and
    # inf here), the gated output norm zeroes them in its own launch.
    gen = torch.Generator().manual_seed(11)
    x = (3 * torch.randn(6, 4, 40, generator=gen)).to(dtype)
    z = torch.randn(6, 4, 40, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(40, generator=gen)).to(dtype)
    x[4], x[5, 0, 0], z[5, 1, 3] = float("nan"), float("inf"), float("nan")
    valid = torch.tensor([True, True, False, True, False, False])
    for backend in ("reference", "triton"):
        got = rms_norm(x, w, 1e-6, "cast", gate=z, valid=valid, backend=backend)
        assert got.dtype == dtype and got.shape == x.shape
        assert torch.equal(got[~valid], torch.zeros_like(got[~valid]))
        # The kept rows are the path's own norm of them, bit for bit (rows are independent).
        assert torch.equal(got[valid], rms_norm(x[valid], w, 1e-6, "cast", gate=z[valid], backend=backend))
    # Without a gate and beside a residual too; the residual's sum is every row's.
    h, r = x[:, 0], torch.randn(6, 40, generator=gen).to(dtype)
    for backend in ("reference", "triton"):
        y, total = rms_norm(h, w, 1e-6, "offset", residual=r, valid=valid, backend=backend)
        y_all, total_all = rms_norm(h, w, 1e-6, "offset", residual=r, backend=backend)
        assert torch.equal(y[~valid], torch.zeros_like(y[~valid])) and torch.equal(y[valid], y_all[valid])
        assert torch.equal(total.nan_to_num(), total_all.nan_to_num())


def test_valid_refusals():
    x = torch.randn(3, 2, 8)
    for backend in ("reference", "triton"):
        for bad in (torch.ones(3), torch.ones(2, dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool)):
            with pytest.raises(ValueError, match="valid"):
                rms_norm(x, torch.ones(8), 1e-6, valid=bad, backend=backend)
        with pytest.raises(ValueError, match="valid"):  # a 1-D x has no rows to keep
            rms_norm(x[0, 0], torch.ones(8), 1e-6, valid=torch.ones(8, dtype=torch.bool), backend=backend)


def test_dispatch_runs_the_kernels_only_when_asked(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(4, 24, generator=gen), torch.randn(24, generator=gen)
    a, b = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    A_log, dt = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    assert torch.equal(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))
    assert all(torch.equal(p, q) for p, q in zip(gdn_gate(a, b, A_log, dt), gdn_gate_ref(a, b, A_log, dt)))
    # The Triton backend on CPU tensors: the interpreted kernels.
    torch.testing.assert_close(rms_norm(x, w, 1e-6, backend="triton"), rms_norm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-5)
    # Rows wider than one program holds take the reference.
    calls = []
    monkeypatch.setattr("flide_ext.kernels.rms_norm.kernel.rms_norm_triton",
                        lambda *a, **k: calls.append(a) or rms_norm_ref(*a, **k))
    wide = torch.randn(2, MAX_TRITON_WIDTH + 1, generator=gen)
    ones = torch.ones(MAX_TRITON_WIDTH + 1)
    assert torch.equal(rms_norm(wide, ones, 1e-6, backend="triton"), rms_norm_ref(wide, ones, 1e-6)) and not calls
    rms_norm(x, w, 1e-6, backend="triton")
    assert len(calls) == 1
    for p, q in zip(gdn_gate(a, b, A_log, dt, "triton"), gdn_gate_ref(a, b, A_log, dt)):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_gate_triton_matches_reference(dtype):
    gen = torch.Generator().manual_seed(11)
    T, HV = 37, 12
    ab = (8 * torch.randn(T, 2 * HV, generator=gen)).to(dtype)
    a, b = ab[:, :HV], ab[:, HV:]  # strided views, as split projections are
    a[0, :4] = torch.tensor([30.0, -30.0, 19.0, -16.0]).to(dtype)  # softplus' linear and tiny ends
    A_log = torch.randn(HV, generator=gen)
    dt_bias = torch.randn(HV, generator=gen).to(dtype)
    g, beta = gdn_gate_triton(a, b, A_log, dt_bias)
    g_ref, beta_ref = gdn_gate_ref(a, b, A_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == dtype and g.shape == beta.shape == (T, HV)
    # g is a log decay, summed and exponentiated: 1e-6 absolute is a 1e-6 relative decay.
    torch.testing.assert_close(g, g_ref, rtol=2e-6, atol=1e-6)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=0, atol=2 ** -8)
    torch.testing.assert_close(beta.float(), beta_ref.float(), **tol)
    assert (g <= 0).all()
    # The reference is the model cards' formula.
    want = -A_log.exp() * F.softplus(a.double() + dt_bias.double()).float()
    torch.testing.assert_close(g_ref, want, rtol=1e-6, atol=1e-7)


def test_gdn_gate_refuses_bad_shapes():
    a = torch.randn(4, 6)
    for fn in (partial(gdn_gate, backend="reference"), partial(gdn_gate, backend="triton")):
        with pytest.raises(ValueError, match="must both be"):
            fn(a, a[:, :5], torch.zeros(6), torch.zeros(6))
        with pytest.raises(ValueError, match="A_log"):
            fn(a, a, torch.zeros(5), torch.zeros(6))
    g, beta = gdn_gate_triton(torch.empty(0, 6), torch.empty(0, 6), torch.zeros(6), torch.zeros(6))
    assert g.shape == beta.shape == (0, 6)


def test_strided_parameters_float64_and_scalars():
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(5, 64, generator=gen)
    for w in (torch.randn(128, generator=gen)[::2], torch.randn(1, generator=gen).expand(64)):  # strided, stride 0
        for mode in ("cast", "offset", "scale"):
            torch.testing.assert_close(rms_norm_triton(x, w, 1e-6, mode), rms_norm_ref(x, w, 1e-6, mode),
                                       rtol=1e-5, atol=1e-5)
    a, b = torch.randn(5, 4, generator=gen), torch.randn(5, 4, generator=gen)
    A_log, dt = torch.randn(8, generator=gen)[::2], torch.randn(1, generator=gen).expand(4)
    for p, q in zip(gdn_gate_triton(a, b, A_log, dt), gdn_gate_ref(a, b, A_log, dt)):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    # float64 is the reference's alone: the kernels (float32 math) refuse it, the
    # dispatch sends it to the reference.
    xd, wd = x.double(), torch.randn(64, generator=gen, dtype=torch.float64)
    with pytest.raises(ValueError, match="x dtype torch.float64"):
        rms_norm_triton(xd, wd, 1e-6)
    with pytest.raises(ValueError, match="weight dtype torch.float64"):
        rms_norm_triton(x, wd, 1e-6)
    with pytest.raises(ValueError, match="b dtype torch.float64"):
        gdn_gate_triton(a, b.double(), A_log, dt)
    assert torch.equal(rms_norm(xd, wd, 1e-6, backend="triton"), rms_norm_ref(xd, wd, 1e-6))
    assert torch.equal(rms_norm(x, wd, 1e-6, backend="triton"), rms_norm_ref(x, wd, 1e-6))
    assert all(torch.equal(p, q) for p, q in zip(gdn_gate(a, b.double(), A_log, dt, "triton"),
                                                  gdn_gate_ref(a, b.double(), A_log, dt)))
    with pytest.raises(ValueError, match="at least one dimension"):
        rms_norm(torch.tensor(2.0), torch.ones(()), 1e-6)


def test_gdn_gate_softplus_to_float32_precision():
    # log(1 + e) rounds 1 + e first; the kernel cancels that rounding, so g keeps
    # float32's relative precision across softplus' whole range (torch's float32
    # softplus: ~1e-7), where a plain log(1 + e) loses up to ~6e-4.
    a = torch.linspace(-25, 25, 5001)[:, None]
    zero = torch.zeros(1)
    g, _ = gdn_gate_triton(a, torch.zeros_like(a), zero, zero)
    g_ref, _ = gdn_gate_ref(a, torch.zeros_like(a), zero, zero)
    rel = ((g.double() - g_ref.double()).abs() / g_ref.double().abs()).max()
    assert rel < 1e-6, float(rel)


@pytest.mark.parametrize("mode", ["cast", "offset", "scale"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_add_inside_the_norm(mode, dtype):
    """``norm(x, residual)`` is ``(norm(x + residual), x + residual)``: the
    pre-norm decoder's add and norm in one launch."""
    gen = torch.Generator().manual_seed(11)
    x = (2 * torch.randn(6, 3, 40, generator=gen)).to(dtype)
    res = torch.randn(6, 3, 80, generator=gen).to(dtype)[..., :40]  # rows at a stride
    w = (0.1 * torch.randn(40, generator=gen) + (mode != "offset")).to(dtype)
    y, total = rms_norm_ref(x, w, 1e-6, mode, residual=res)
    assert torch.equal(total, x + res) and torch.equal(y, rms_norm_ref(x + res, w, 1e-6, mode))
    got_y, got_total = rms_norm_triton(x, w, 1e-6, mode, residual=res)
    assert got_total.is_contiguous() and got_y.dtype == y.dtype and got_total.dtype == dtype
    if dtype == torch.float32:
        assert torch.equal(got_total, total)  # one IEEE add
        torch.testing.assert_close(got_y, y, rtol=1e-5, atol=1e-5)
    else:
        # The interpreter truncates the add's bf16 result where the GPU rounds to
        # nearest even: an ulp in the sum, and the norm's tolerance above it.
        torch.testing.assert_close(got_total.float(), total.float(), rtol=2 ** -7, atol=2 ** -7)
        torch.testing.assert_close(got_y.float(), y.float(), rtol=2 ** -5, atol=2 ** -5)
    d_y, d_total = rms_norm(x, w, 1e-6, mode, residual=res, backend="triton")
    assert torch.equal(d_y, got_y) and torch.equal(d_total, got_total)
    c_y, c_total = rms_norm(x, w, 1e-6, mode, residual=res)  # CPU: the reference
    assert torch.equal(c_y, y) and torch.equal(c_total, total)


@pytest.mark.parametrize("mode", ["cast", "offset"])
def test_float32_residual_stream_beside_bf16_rows(mode):
    """A float32 residual beside bf16 rows: the sum stays float32 (no rounding),
    the normalised output rounds as a bf16 row's."""
    gen = torch.Generator().manual_seed(12)
    x = (2 * torch.randn(7, 48, generator=gen)).to(torch.bfloat16)
    res = 3 * torch.randn(7, 48, generator=gen)
    w = (0.1 * torch.randn(48, generator=gen) + (mode == "cast")).to(torch.bfloat16)
    y, total = rms_norm_ref(x, w, 1e-6, mode, residual=res)
    assert total.dtype == torch.float32 and torch.equal(total, x.float() + res)
    h = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6)
    want = (h * (1 + w.float())).to(torch.bfloat16) if mode == "offset" else w * h.to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, want)
    assert not torch.equal(total, (x + res.to(torch.bfloat16)).float())  # a bf16 stream would round it
    got_y, got_total = rms_norm_triton(x, w, 1e-6, mode, residual=res)
    assert got_total.dtype == torch.float32 and torch.equal(got_total, total)  # one IEEE add
    torch.testing.assert_close(got_y.float(), y.float(), rtol=2 ** -6, atol=2 ** -6)
    with pytest.raises(ValueError, match="float32"):
        rms_norm(x, w, 1e-6, mode, residual=res.half())
    with pytest.raises(ValueError, match="beside bf16 / fp16 rows"):  # not narrower than x
        rms_norm(res.double(), w.double(), 1e-6, mode, residual=res)


def test_residual_refusals():
    x, w = torch.randn(3, 8), torch.ones(8)
    for fn in (partial(rms_norm, backend="reference"), partial(rms_norm, backend="triton")):
        with pytest.raises(ValueError, match="residual is not supported with a gate"):
            fn(x, w, 1e-6, "cast", gate=x, residual=x)
        with pytest.raises(ValueError, match="residual"):
            fn(x, w, 1e-6, residual=x[:2])
        with pytest.raises(ValueError, match="residual"):
            fn(x, w, 1e-6, residual=x.to(torch.bfloat16))
    y, total = rms_norm_triton(torch.empty(0, 8), w, 1e-6, residual=torch.empty(0, 8))
    assert y.shape == total.shape == (0, 8)


def test_norm_modules_carry_the_residual():
    """The norm modules given ``(x, residual)`` return the norm of the sum and the
    sum, as the decoder blocks use them."""
    from flide_ext.layers.norm import RMSNorm, ZeroCenteredRMSNorm

    gen = torch.Generator().manual_seed(2)
    x, res = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    for norm in (RMSNorm(16, 1e-6), ZeroCenteredRMSNorm(16, 1e-6)):
        with torch.no_grad():
            norm.weight.copy_(0.1 * torch.randn(16, generator=gen))
            y, total = norm(x, res)
            assert torch.equal(total, x + res) and torch.equal(y, norm(x + res))
