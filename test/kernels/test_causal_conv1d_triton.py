"""The causal-conv1d Triton kernel (level by level) under the Triton interpreter
(``TRITON_INTERPRET=1``) on the CPU against its PyTorch reference."""

import os

# conftest.py sets this before anything imports triton (triton.jit reads it at
# decoration time); kept here so the module also runs on its own.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flide_ext.kernels.causal_conv1d import causal_conv1d_ref  # noqa: E402
from flide_ext.kernels.causal_conv1d.kernel import causal_conv1d_triton  # noqa: E402
from test.helpers.kernel_inputs import TREE_ROWS, segment_table, tree_levels  # noqa: E402


@pytest.mark.parametrize("bias,activation", [(False, "silu"), (True, None)])
def test_causal_conv1d_matches_reference(bias, activation):
    gen = torch.Generator().manual_seed(6)
    T, C, W = 23, 150, 4
    x = torch.randn(T, C, generator=gen)
    weight = torch.randn(C, W, generator=gen)
    b = torch.randn(C, generator=gen) if bias else None
    starts, lens, initial, final = segment_table()
    pools = [torch.full((6, C, W - 1), float("nan")) for _ in range(2)]
    outs = [torch.full((T, C), float("nan")) for _ in range(2)]
    for fn, pool, out in zip((causal_conv1d_ref, causal_conv1d_triton), pools, outs):
        for level in (slice(0, 3), slice(3, 6)):
            fn(x, weight, b, pool, starts[level], lens[level], initial[level], final[level], activation, out=out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert not outs[1].isnan().any()
    written = final[final >= 0]
    torch.testing.assert_close(pools[1][written], pools[0][written], rtol=0, atol=0)


def test_causal_conv1d_long_segments_match_reference():
    """Segments spanning several row blocks (a program per 32 rows), a 1-row and
    an empty segment, a resumed root and three levels."""
    gen = torch.Generator().manual_seed(16)
    T, C, W = TREE_ROWS, 150, 4
    x = torch.randn(T, C, generator=gen)
    weight = torch.randn(C, W, generator=gen)
    pool = torch.full((8, C, W - 1), float("nan"))
    pool[5] = torch.randn(C, W - 1, generator=gen)
    pools = [pool.clone(), pool.clone()]
    outs = [torch.full((T, C), float("nan")) for _ in range(2)]
    for fn, pool, out in zip((causal_conv1d_ref, causal_conv1d_triton), pools, outs):
        for level in tree_levels():
            fn(x, weight, None, pool, *level, "silu", out=out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert not outs[1].isnan().any()
    torch.testing.assert_close(pools[1][[0, 1, 2, 3, 4, 6, 7]], pools[0][[0, 1, 2, 3, 4, 6, 7]], rtol=0, atol=0)
