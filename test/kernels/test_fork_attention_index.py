"""ForkAttention's paged K/V indirection (``kv_index``): keys and values read in
place from shuffled K/V pools give the bits of the contiguous key array, in the
reference and in the Triton kernel (under the Triton interpreter on the CPU)."""

import os

# conftest.py sets this before anything imports triton (triton.jit reads it at
# decoration time); kept here so the module also runs on its own.
os.environ.setdefault("TRITON_INTERPRET", "1")

import inspect  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from flide_ext.kernels.fork_attention import fork_attention, fork_attention_ref  # noqa: E402
from flide_ext.kernels.fork_attention import reference as leaf  # noqa: E402
from flide_ext.kernels.fork_attention.kernel import fork_attention_triton  # noqa: E402
from flide_ext.plan.flat import Resume, plan_round  # noqa: E402

NAN = float("nan")


def forked_resumed_plan():
    """Request 0 resumes from a 30-token checkpoint at key rows [5, 35) (a virtual
    segment) and forks three questions off the rest of its state; request 1 is
    cold and forks two. Key rows [0, 5) belong to no segment."""
    state = list(range(1, 41))
    other = list(range(200, 231))
    prompts = [state + [60, 61, 62], state + [70], state + [80, 81, 82, 83, 84], other + [90, 91], other + [95]]
    plan = plan_round([0, 0, 0, 1, 1], prompts, resume={0: Resume(length=30, slot=-1, kv_start=5)})
    assert plan.num_prefix_rows == 35 and len(plan.resume) == 1
    assert int((plan.seg_len == 0).sum()) == 1  # the checkpoint's virtual segment
    assert plan.seg_parent.max() >= 0  # forked
    return plan


def contiguous_args(plan, Hq, Hkv, D, DV, seed):
    gen = torch.Generator().manual_seed(seed)
    Tk = plan.num_prefix_rows + plan.num_tokens
    q = torch.randn(plan.num_tokens, Hq, D, generator=gen)
    k = torch.randn(Tk, Hkv, D, generator=gen)
    v = torch.randn(Tk, Hkv, DV, generator=gen)
    return (q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
            plan.positions, plan.kv_positions, D**-0.5)


def used_positions(plan, Tk):
    used = torch.zeros(Tk, dtype=torch.bool)
    for s, n in zip(plan.seg_kv_start.tolist(), plan.seg_kv_len.tolist()):
        used[s : s + n] = True
    return used


def pooled(plan, k, v, seed, dtype=torch.int64, tail=5):
    """``k`` and ``v`` scattered into shuffled pools of more than twice their rows,
    every other row NaN; the index of each key-array position (unused positions
    and ``tail`` entries past the key array point at NaN rows)."""
    gen = torch.Generator().manual_seed(seed)
    Tk = k.shape[0]
    N = 2 * Tk + 17
    perm = torch.randperm(N, generator=gen)
    index = perm[:Tk].clone()
    garbage = perm[Tk:]
    used = used_positions(plan, Tk)
    assert 0 < int((~used).sum()) < Tk
    index[~used] = garbage[: int((~used).sum())]
    index = torch.cat([index, garbage[-tail:]]) if tail else index
    k_pool = torch.full((N, *k.shape[1:]), NAN, dtype=k.dtype)
    v_pool = torch.full((N, *v.shape[1:]), NAN, dtype=v.dtype)
    k_pool[index[:Tk][used]] = k[used]
    v_pool[index[:Tk][used]] = v[used]
    assert k_pool.isnan().any(dim=(1, 2)).sum() > N // 2
    return k_pool, v_pool, index.to(dtype)


@pytest.mark.parametrize("heads", [(4, 2), (6, 1), (2, 2)])
@pytest.mark.parametrize("window", [None, 3, 12])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_reference_index_over_pool_equals_contiguous_bitwise(heads, window, dtype):
    plan = forked_resumed_plan()
    q, k, v, *rest = contiguous_args(plan, *heads, 16, 8, seed=heads[0] * 10 + (window or 0))
    want = leaf.fork_attention_ref(q, k, v, *rest, window)
    k_pool, v_pool, index = pooled(plan, k, v, seed=1, dtype=dtype)
    got = fork_attention_ref(q, k_pool, v_pool, *rest, window, None, index)
    assert not want.isnan().any()
    assert torch.equal(got, want)
    # The public function, index by keyword, gives the same.
    assert torch.equal(fork_attention(q, k_pool, v_pool, *rest, sliding_window=window, kv_index=index,
                                      backend="reference"), want)


def test_reference_follows_the_index():
    """A permuted index reads other rows: the result changes (so the test above can fail)."""
    plan = forked_resumed_plan()
    q, k, v, *rest = contiguous_args(plan, 4, 2, 16, 16, seed=7)
    Tk = k.shape[0]
    perm = torch.randperm(Tk, generator=torch.Generator().manual_seed(2))
    got = fork_attention_ref(q, k, v, *rest, kv_index=perm)
    assert torch.equal(got, fork_attention_ref(q, k[perm], v[perm], *rest))
    assert not torch.equal(got, fork_attention_ref(q, k, v, *rest))
    identity = fork_attention_ref(q, k, v, *rest, kv_index=torch.arange(Tk, dtype=torch.int32))
    assert torch.equal(identity, fork_attention_ref(q, k, v, *rest))


def test_kv_index_argument_errors():
    plan = forked_resumed_plan()
    q, k, v, *rest = contiguous_args(plan, 4, 2, 16, 16, seed=3)
    Tk = k.shape[0]
    bad = [
        (torch.arange(Tk).view(1, Tk), r"1-D int32 or int64 tensor, not torch\.int64 \(1, \d+\)"),
        (torch.arange(Tk).float(), r"1-D int32 or int64 tensor, not torch\.float32"),
        (torch.ones(Tk, dtype=torch.bool), r"not torch\.bool"),
        (torch.arange(Tk, dtype=torch.int16), r"not torch\.int16"),
        (list(range(Tk)), r"1-D int32 or int64 tensor, not list"),
        (torch.empty(Tk, dtype=torch.long, device="meta"), r"kv_index is on meta, q on cpu"),
    ]
    for index, message in bad:
        for backend in ("reference", "triton"):
            with pytest.raises(ValueError, match=message):
                fork_attention(q, k, v, *rest, kv_index=index, backend=backend)
        with pytest.raises(ValueError, match=message):
            fork_attention_ref(q, k, v, *rest, None, None, index)  # by position


def test_signatures_end_with_kv_index():
    for fn in (leaf.fork_attention_ref, fork_attention_ref, fork_attention_triton):
        params = inspect.signature(fn).parameters
        assert list(params)[-1] == "kv_index" and params["kv_index"].default is None
    assert list(inspect.signature(fork_attention).parameters)[-2:] == ["kv_index", "backend"]
    assert inspect.signature(fork_attention_triton) == inspect.signature(leaf.fork_attention_ref)


@pytest.mark.parametrize("Hq,Hkv,D,DV,window", [(4, 2, 16, 16, None), (4, 2, 16, 16, 5), (6, 2, 32, 16, 9)])
def test_triton_index_over_pool_equals_contiguous_bitwise(Hq, Hkv, D, DV, window):
    plan = forked_resumed_plan()
    q, k, v, *rest = contiguous_args(plan, Hq, Hkv, D, DV, seed=Hq + D + (window or 0))
    want = fork_attention_triton(q, k, v, *rest, window)
    k_pool, v_pool, index = pooled(plan, k, v, seed=4)
    got = fork_attention_triton(q, k_pool, v_pool, *rest, window, None, index)
    assert not want.isnan().any()
    assert torch.equal(got, want)
    ref = fork_attention_ref(q, k_pool, v_pool, *rest, window, None, index)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # The public function on the Triton path, keyword index.
    assert torch.equal(fork_attention(q, k_pool, v_pool, *rest, sliding_window=window, kv_index=index,
                                      backend="triton"), want)


def test_triton_int32_strided_index_and_strided_pool():
    """An int32 index that is a strided view, and pools that are views with a row
    stride wider than the heads, read the same keys."""
    plan = forked_resumed_plan()
    q, k, v, *rest = contiguous_args(plan, 4, 2, 16, 16, seed=21)
    k_pool, v_pool, index = pooled(plan, k, v, seed=5, dtype=torch.int32)
    strided = torch.zeros(2 * index.numel(), dtype=torch.int32)[::2]
    strided.copy_(index)
    wide_k = torch.full((k_pool.shape[0], 3, 24), NAN)
    wide_k[:, :2, :16] = k_pool
    wide_v = torch.full((v_pool.shape[0], 3, 24), NAN)
    wide_v[:, :2, :16] = v_pool
    k_view, v_view = wide_k[:, :2, :16], wide_v[:, :2, :16]
    for window in (None, 4):
        want = fork_attention_triton(q, k, v, *rest, window)
        assert torch.equal(fork_attention_triton(q, k_view, v_view, *rest, window, kv_index=strided), want)


@pytest.mark.parametrize("config", [(32, 16, 4, 1, True), (16, 32, 4, 1, False)])
def test_triton_index_other_tilings(monkeypatch, config):
    """Packed GQA rows and other tile shapes: with an index the same bits as without."""
    import flide_ext.kernels.fork_attention.kernel as fat

    monkeypatch.setattr(fat, "TILE_OVERRIDE", config)
    plan = forked_resumed_plan()
    q, k, v, *rest = contiguous_args(plan, 8, 2, 16, 16, seed=31)
    k_pool, v_pool, index = pooled(plan, k, v, seed=6)
    for window in (None, 6):
        want = fat.fork_attention_triton(q, k, v, *rest, window)
        got = fat.fork_attention_triton(q, k_pool, v_pool, *rest, window, kv_index=index)
        assert torch.equal(got, want)
        torch.testing.assert_close(got, fork_attention_ref(q, k, v, *rest, window), rtol=1e-5, atol=1e-5)
