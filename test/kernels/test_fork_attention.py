"""ForkAttention reference against a dense-mask oracle built from the visibility rule."""

from __future__ import annotations

import random

import pytest
import torch

from flide_ext.kernels.fork_attention import fork_attention_ref
from flide_ext.plan.flat import plan_round


def dense_oracle(q, k, v, plan, scale, window=None):
    """Attention with a full [T, T] mask written straight from DESIGN.md's rule."""
    T = q.shape[0]
    seg = plan.token_segment.tolist()
    parent = plan.seg_parent.tolist()
    pos = plan.positions.tolist()
    request = plan.seg_request.tolist()

    def ancestors(s):
        out = set()
        while s >= 0:
            out.add(s)
            s = parent[s]
        return out

    paths = [ancestors(s) for s in range(len(parent))]
    mask = torch.zeros(T, T, dtype=torch.bool)
    for t in range(T):
        for s in range(T):
            ok = request[seg[t]] == request[seg[s]] and seg[s] in paths[seg[t]] and pos[s] <= pos[t]
            if window is not None:
                ok = ok and pos[t] - pos[s] < window
            mask[t, s] = ok
    G = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(G, dim=1)
    vv = v.double().repeat_interleave(G, dim=1)
    scores = torch.einsum("thd,shd->hts", q.double(), kk) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(scores, -1), vv)


def random_round(rng):
    requests, prompts = [], []
    for r in range(rng.randint(1, 3)):
        state = [rng.randrange(3) for _ in range(rng.randint(1, 20))]
        for _ in range(rng.randint(1, 6)):
            cut = rng.randint(1, len(state))
            prompts.append(state[:cut] + [rng.randrange(3) for _ in range(rng.randint(0, 6))])
            requests.append(r)
    return plan_round(requests, prompts)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("window", [None, 3])
def test_reference_matches_dense_rule(seed, heads, window):
    rng = random.Random(seed)
    plan = random_round(rng)
    torch.manual_seed(seed)
    T, (hq, hkv), d = plan.num_tokens, heads, 16
    q, k, v = torch.randn(T, hq, d), torch.randn(T, hkv, d), torch.randn(T, hkv, d)
    out = fork_attention_ref(q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
                             plan.positions, plan.kv_positions, d**-0.5, window)
    ref = dense_oracle(q, k, v, plan, d**-0.5, window)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_empty_segments_and_one_token_segments():
    # Root [0,3), an empty child, a one-token child, a two-token grandchild.
    seg_parent = torch.tensor([-1, 0, 0, 2])
    seg_start = torch.tensor([0, 3, 3, 4])
    seg_len = torch.tensor([3, 0, 1, 2])
    positions = torch.tensor([0, 1, 2, 3, 4, 5])
    torch.manual_seed(0)
    q, k, v = torch.randn(6, 2, 8), torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    out = fork_attention_ref(q, k, v, seg_parent, seg_start, seg_len, seg_start, seg_len, positions, positions, 8**-0.5)
    # The stream here is one causal sequence, so plain causal attention must agree.
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    ).transpose(0, 1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_long_segment_crosses_query_blocks():
    plan = plan_round([0, 0], [list(range(700)) + [1], list(range(700)) + [2, 3]])
    torch.manual_seed(1)
    T = plan.num_tokens
    q, k, v = torch.randn(T, 2, 8), torch.randn(T, 1, 8), torch.randn(T, 1, 8)
    out = fork_attention_ref(q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start,
                             plan.seg_kv_len, plan.positions, plan.kv_positions, 8**-0.5)
    full = torch.nn.functional.scaled_dot_product_attention(
        q[:702].transpose(0, 1), k[:702].repeat_interleave(2, 1).transpose(0, 1),
        v[:702].repeat_interleave(2, 1).transpose(0, 1), is_causal=True,
    ).transpose(0, 1)
    torch.testing.assert_close(out[:701], full[:701], atol=1e-5, rtol=1e-5)
