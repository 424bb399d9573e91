"""The fused rotary kernel under the Triton interpreter (``TRITON_INTERPRET=1``,
set by conftest.py) against its PyTorch reference, and the reference against
transformers' own rotary of the same checkpoints."""

import os
from functools import partial

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flide_ext.kernels.rotary import rotary, rotary_ref  # noqa: E402
from flide_ext.kernels.rotary.kernel import rotary_triton  # noqa: E402


def _tables(T, R, dtype, gen, theta=1e4):
    positions = torch.randint(0, 5000, (T,), generator=gen)
    inv_freq = 1.0 / theta ** (torch.arange(0, R, 2).float() / R)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_transformers_rotary(dtype):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(0)
    T, H, D = 9, 4, 32
    q, k = torch.randn(T, H, D, generator=gen).to(dtype), torch.randn(T, 2, D, generator=gen).to(dtype)
    cos, sin = _tables(T, D, dtype, gen)
    # transformers' layout: [batch, heads, T, D], cos/sin [batch, T, D].
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    assert torch.equal(rotary_ref(q, cos, sin), hq[0].transpose(0, 1))
    assert torch.equal(rotary_ref(k, cos, sin), hk[0].transpose(0, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,H,D,R", [(7, 16, 256, 64), (5, 8, 64, 64), (3, 3, 40, 24), (1, 1, 2, 2), (4, 2, 12, 0)])
def test_triton_matches_reference(dtype, T, H, D, R):
    gen = torch.Generator().manual_seed(T * 100 + D)
    # A head split of a gated q_proj: each head's query half, rows at stride 2HD.
    qg = (3 * torch.randn(T, H, 2 * D, generator=gen)).to(dtype)
    x = qg[..., :D]
    cos, sin = _tables(T, R, dtype, gen) if R else (torch.empty(T, 0, dtype=dtype), torch.empty(T, 0, dtype=dtype))
    got, want = rotary_triton(x, cos, sin), rotary_ref(x, cos, sin)
    assert got.shape == want.shape and got.dtype == dtype and got.is_contiguous()
    if dtype == torch.float32:
        assert torch.equal(got, want)  # IEEE products and sum, as torch's
    else:
        # The interpreter truncates to bf16 where the GPU rounds to nearest even
        # (three roundings here); the GPU check holds bf16 to two ulps.
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -5, atol=2 ** -5)
        assert torch.equal(got[..., R:], x[..., R:])  # the unrotated features, copied


def test_refuses_bad_arguments():
    x = torch.randn(3, 2, 8)
    cos = torch.randn(3, 4)
    for fn in (partial(rotary, backend="reference"), partial(rotary, backend="triton")):
        with pytest.raises(ValueError, match=r"\[T, H, D\]"):
            fn(x[0], cos, cos)
        with pytest.raises(ValueError, match="must both be"):
            fn(x, cos[:2], cos[:2])
        with pytest.raises(ValueError, match="even"):
            fn(x, cos[:, :3], cos[:, :3])
        with pytest.raises(ValueError, match="even"):
            fn(x, torch.randn(3, 10), torch.randn(3, 10))
        with pytest.raises(ValueError, match="dtype"):
            fn(x, cos.double(), cos.double())
    with pytest.raises(ValueError, match="float32, bfloat16, float16"):
        rotary_triton(x.double(), cos.double(), cos.double())


def test_dispatch():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4, 2, 16, generator=gen)
    cos, sin = _tables(4, 8, torch.float32, gen)
    assert torch.equal(rotary(x, cos, sin), rotary_ref(x, cos, sin))
    assert torch.equal(rotary(x, cos, sin, backend="triton"), rotary_ref(x, cos, sin))
    d = x.double()
    assert torch.equal(rotary(d, cos.double(), sin.double(), "triton"), rotary_ref(d, cos.double(), sin.double()))
