"""The readout's logits are float32: a bf16 model's LM head product is not
rounded back to bf16 (whose rounding at logits of magnitude ~40 moves label
probabilities by percents), and a row's logits do not depend on the other rows."""

import pytest
import torch

from flide_ext.layers.linear import Linear
from flide_ext.layers.norm import RMSNorm
from flide_ext.layers.readout import lm_head_logits, readout_logprobs


def _head(dtype, scale=0.8, vocab=512, hidden=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    head = Linear(hidden, vocab, bias=False).to(dtype)
    with torch.no_grad():
        head.weight.copy_((torch.randn(vocab, hidden, generator=gen) * scale).to(dtype))
    x = torch.randn(40, hidden, generator=gen).to(dtype)
    return head, x


def test_bf16_logits_are_the_float64_product_rounded_once_to_float32():
    head, x = _head(torch.bfloat16)
    logits = lm_head_logits(x, head.weight)
    exact = x.double() @ head.weight.double().T
    assert logits.dtype == torch.float32
    assert torch.equal(logits, exact.float())
    # Logits of magnitude ~ 0.8 * sqrt(256) = 13: the bf16 output the plain layer
    # gives is off by up to half a bf16 ulp (1/32 there), the float32 one by far less.
    plain = head(x).float()
    assert (plain.double() - exact).abs().max() > 1e-2
    assert (logits.double() - exact).abs().max() < 1e-5


def test_a_row_alone_equals_the_row_among_others():
    head, x = _head(torch.bfloat16, seed=1)
    batch = lm_head_logits(x, head.weight)
    for i in (0, 7, 39):
        assert torch.equal(lm_head_logits(x[i:i + 1], head.weight)[0], batch[i])


def test_float32_model_keeps_its_linear_layer():
    head, x = _head(torch.float32, seed=2)
    assert torch.equal(lm_head_logits(x, head.weight), head(x))


def test_readout_logprobs_read_the_rows_through_the_norm():
    head, x = _head(torch.bfloat16, seed=3)
    norm = RMSNorm(x.shape[1], eps=1e-6).to(torch.bfloat16)
    rows = torch.tensor([5, 0, 17])
    out = readout_logprobs(x, rows, norm, head)
    want = torch.log_softmax(lm_head_logits(norm(x[rows]), head.weight), dim=-1)
    assert out.dtype == torch.float32 and out.shape == (3, 512)
    assert torch.equal(out, want)
    assert torch.allclose(out.exp().sum(-1), torch.ones(3), atol=1e-5)


def test_a_head_with_bias_is_refused():
    norm = RMSNorm(8, eps=1e-6)
    biased = torch.nn.Linear(8, 16, bias=True)
    with pytest.raises(ValueError, match="bias"):
        readout_logprobs(torch.zeros(2, 8), torch.tensor([0]), norm, biased)
