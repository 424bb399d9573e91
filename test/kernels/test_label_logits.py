"""The label-only readout's kernel under the Triton interpreter
(``TRITON_INTERPRET=1``, set by conftest.py) against its PyTorch reference, the
reference against the full LM head product, and a pair's value alone against
the same pair among others (bitwise)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flide_ext.kernels.label_logits import label_logits, label_logits_ref  # noqa: E402
from flide_ext.kernels.label_logits.kernel import label_logits_triton  # noqa: E402
from flide_ext.layers.readout import lm_head_logits  # noqa: E402


def _rows_and_head(R, hidden, vocab, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(R, hidden, generator=gen).to(dtype)
    weight = (0.5 * torch.randn(vocab, hidden, generator=gen)).to(dtype)
    return x, weight


def _pairs(R, vocab, P, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, R, (P,), generator=gen), torch.randint(0, vocab, (P,), generator=gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_the_full_products_entries(dtype):
    x, weight = _rows_and_head(5, 96, 300, dtype, 1)
    rows, labels = _pairs(5, 300, 40, 2)
    full = lm_head_logits(x, weight)  # [R, vocab] float32, float64 products on the CPU
    got = label_logits_ref(x, weight, rows, labels)
    assert got.dtype == torch.float32 and got.shape == (40,)
    torch.testing.assert_close(got, full[rows, labels], rtol=2 ** -23, atol=1e-30)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 100, 1500])
def test_triton_matches_reference(dtype, hidden):
    x, weight = _rows_and_head(7, hidden, 50, dtype, hidden)
    rows, labels = _pairs(7, 50, 23, hidden + 1)
    got = label_logits_triton(x, weight, rows, labels)
    want = label_logits_ref(x, weight, rows, labels)
    assert got.dtype == torch.float32 and got.shape == (23,)
    # float32 accumulation against float64's: a few float32 ulps of the sum's terms.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * hidden ** 0.5)


def test_a_pair_alone_equals_the_pair_among_others():
    x, weight = _rows_and_head(9, 200, 64, torch.bfloat16, 3)
    rows, labels = _pairs(9, 64, 31, 4)
    many = label_logits(x, weight, rows, labels, backend="triton")
    for p in (0, 13, 30):
        alone = label_logits(x, weight, rows[p:p + 1], labels[p:p + 1], backend="triton")
        assert torch.equal(alone[0], many[p])


def test_strided_rows_are_read_in_place():
    """A head and rows that are views of wider tensors (every other column block)
    give the bits of their contiguous copies."""
    wide_x, wide_w = _rows_and_head(6, 2 * 96, 40, torch.bfloat16, 7)
    x, weight = wide_x[:, 96:], wide_w[:, :96]
    assert not x.is_contiguous() and not weight.is_contiguous()
    rows, labels = _pairs(6, 40, 17, 8)
    got = label_logits(x, weight, rows, labels, backend="triton")
    assert torch.equal(got, label_logits(x.contiguous(), weight.contiguous(), rows, labels, backend="triton"))
    torch.testing.assert_close(got, label_logits_ref(x, weight, rows, labels), rtol=1e-5, atol=1e-4)


def test_no_pairs_give_an_empty_answer():
    x, weight = _rows_and_head(2, 32, 10, torch.bfloat16, 5)
    empty = torch.zeros(0, dtype=torch.long)
    for backend in ("triton", "reference"):
        out = label_logits(x, weight, empty, empty, backend=backend)
        assert out.shape == (0,) and out.dtype == torch.float32


def test_bad_arguments_are_refused():
    x, weight = _rows_and_head(2, 32, 10, torch.bfloat16, 6)
    rows, labels = torch.tensor([0, 1]), torch.tensor([3, 4])
    with pytest.raises(ValueError, match="hidden"):
        label_logits(x, weight[:, :16], rows, labels)
    with pytest.raises(ValueError, match="dtype"):
        label_logits(x.float(), weight, rows, labels)
    with pytest.raises(ValueError, match=r"\[P\]"):
        label_logits(x, weight, rows, labels[:1])
    with pytest.raises(ValueError, match="int64"):
        label_logits(x, weight, rows.int(), labels.int())


def test_integer_rows_are_refused_and_empty_rows_give_zero():
    x, weight = torch.ones(2, 4, dtype=torch.int64), torch.ones(8, 4, dtype=torch.int64)
    pairs = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="floating-point"):
        label_logits(x, weight, pairs, pairs)
    for backend in ("triton", "reference"):
        out = label_logits(torch.zeros(2, 0), torch.zeros(8, 0), pairs, pairs, backend=backend)
        assert torch.equal(out, torch.zeros(2))
