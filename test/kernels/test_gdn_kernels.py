"""GDN reference kernels: chunked vs recurrent form, varlen segments with states
read and written by pool slot, and both against transformers' own torch GDN
reference on single sequences."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flide_ext.kernels.causal_conv1d import causal_conv1d_ref
from flide_ext.kernels.gated_delta_rule import chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref


def inputs(T, H=2, HV=4, K=16, V=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(T, H, K, generator=g), torch.randn(T, H, K, generator=g)
    v = torch.randn(T, HV, V, generator=g)
    decay = -torch.rand(T, HV, generator=g) * 0.7
    beta = torch.rand(T, HV, generator=g)
    return q, k, v, decay, beta


def run(fn, q, k, v, g, beta, pool, segments):
    start, length, first, last = (torch.tensor(x) for x in zip(*segments))
    return fn(q, k, v, g, beta, q.shape[-1] ** -0.5, pool, start, length, first, last)


@pytest.mark.parametrize("T", [1, 2, 63, 64, 65, 130])
def test_chunk_equals_recurrent_and_transformers(T):
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    q, k, v, g, beta = inputs(T, seed=T)
    pools = [torch.full((2, 4, 16, 8), float("nan")) for _ in range(2)]
    outs = [run(fn, q, k, v, g, beta, pool, [(0, T, -1, 1)]) for fn, pool in
            zip([chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref], pools)]
    ref, state = torch_recurrent_gated_delta_rule(
        q.repeat_interleave(2, 1)[None], k.repeat_interleave(2, 1)[None], v[None], g[None], beta[None],
        output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    for out, pool in zip(outs, pools):
        torch.testing.assert_close(out, ref[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(pool[1], state[0], atol=2e-5, rtol=1e-4)
        assert torch.isnan(pool[0]).all()  # slots not named are untouched


@pytest.mark.parametrize("fn", [chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref])
def test_forked_segments_read_parent_slot_by_index(fn):
    """A state segment, then three children run together from its slot, equal each
    child's full sequence run from zeros."""
    T_state, children = 70, [1, 5, 66]
    q, k, v, g, beta = inputs(T_state + sum(children), seed=3)
    pool = torch.zeros(5, 4, 16, 8)
    out = torch.zeros_like(v)
    out += run(fn, q, k, v, g, beta, pool, [(0, T_state, -1, 0)])
    segs, start = [], T_state
    for i, n in enumerate(children):
        segs.append((start, n, 0, i + 1))
        start += n
    out += run(fn, q, k, v, g, beta, pool, segs)
    for (s, n, _, slot) in segs:
        rows = torch.cat([torch.arange(T_state), torch.arange(s, s + n)])
        alone_pool = torch.zeros(1, 4, 16, 8)
        alone = fn(q[rows], k[rows], v[rows], g[rows], beta[rows], 16 ** -0.5, alone_pool,
                   torch.tensor([0]), torch.tensor([len(rows)]), torch.tensor([-1]), torch.tensor([0]))
        torch.testing.assert_close(out[s : s + n], alone[T_state:], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(pool[slot], alone_pool[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("parent_len", [1, 2, 3, 4, 10])
def test_conv_window_follows_the_path(parent_len):
    """Children of a short parent need tokens from before the parent: the window
    written to the parent's slot carries them."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn

    C, W = 6, 4
    gen = torch.Generator().manual_seed(parent_len)
    x = torch.randn(20 + parent_len + 7, C, generator=gen)
    weight = torch.randn(C, W, generator=gen)
    pool = torch.full((3, C, W - 1), float("nan"))
    segs = [(0, 20, -1, 0), (20, parent_len, 0, 1), (20 + parent_len, 7, 1, 2)]
    out = torch.zeros_like(x)
    for s in segs:
        start, length, first, last = (torch.tensor([v]) for v in s)
        out += causal_conv1d_ref(x, weight, None, pool, start, length, first, last)
    full = causal_conv1d_fn(x.t()[None], weight, None, activation="silu")[0].t()
    torch.testing.assert_close(out, full, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(pool[2], x[-(W - 1):].t())


def test_conv_matches_torch_conv1d_on_zero_window():
    C, W, T = 5, 4, 9
    x, weight = torch.randn(T, C), torch.randn(C, W)
    pool = torch.zeros(1, C, W - 1)
    out = causal_conv1d_ref(x, weight, None, pool, torch.tensor([0]), torch.tensor([T]), torch.tensor([-1]), torch.tensor([-1]))
    ref = F.silu(F.conv1d(x.t()[None], weight[:, None, :], padding=W - 1, groups=C)[0, :, :T]).t()
    torch.testing.assert_close(out, ref)
