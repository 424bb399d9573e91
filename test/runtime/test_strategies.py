"""The engine's execution strategies give every question the same answer
(flide_ext/runtime/strategies.py), and the readout switch changes no answer."""

from __future__ import annotations

import pytest
import torch

from flide_ext import Engine
from flide_ext.runtime.strategies import STRATEGIES, cached_length, run_strategy


def _groups(seed=0):
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for n_state in (150, 70, 5):
        state = torch.randint(3, 200, (n_state,), generator=gen).tolist()
        prompts = [state + torch.randint(3, 200, (k,), generator=gen).tolist() for k in (1, 4, 9)]
        groups.append((prompts, [[1, 2, 3]] * len(prompts)))
    groups.append(([[9, 8, 7]], [[4, 5]]))  # a single question: nothing shared
    return groups


def test_cached_length():
    prompts = [list(range(150)) + [500], list(range(150)) + [501, 502]]
    assert cached_length(prompts, recurrent=False) == 150
    assert cached_length(prompts, recurrent=True) == 128
    assert cached_length(prompts, recurrent=True, grid=100) == 100
    assert cached_length([list(range(40)), list(range(40)) + [1]], recurrent=False) == 39  # a question keeps a token
    assert cached_length([[1, 2]], recurrent=True) == 0


@pytest.mark.parametrize("family", ["qwen3_5", "llama"])
def test_strategies_answer_alike(tiny_dirs, family, monkeypatch):
    engine = Engine(str(tiny_dirs[family]))
    groups = _groups()
    flide = run_strategy(engine, groups, "flide")
    want, stream = flide.answers, flide.stats.stream_tokens
    for strategy in STRATEGIES[1:]:
        result = run_strategy(engine, groups, strategy)
        got = result.answers
        for g_req, w_req in zip(got, want):
            for g, w in zip(g_req, w_req):
                torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=1e-5, atol=1e-5)
        assert len(engine.checkpoints) == 0  # the strategy's cache entries are gone
        if strategy == "prefix_cache":  # every question resumed from its request's cached state
            recurrent = engine.model.num_gdn_layers > 0
            assert result.stats.resumed_tokens == sum(
                cached_length(prompts, recurrent) * len(prompts) for prompts, _ in groups) > 0
            # Tokens computed: each cached state once, then every question's uncached rest.
            assert result.stats.stream_tokens == sum(
                cached_length(prompts, recurrent) + sum(len(p) - cached_length(prompts, recurrent) for p in prompts)
                for prompts, _ in groups)
    # no_fork recomputes every state per question: more stream tokens than Flide.
    no_fork = run_strategy(engine, groups, "no_fork")
    assert no_fork.stats.stream_tokens == sum(len(p) for prompts, _ in groups for p in prompts) > stream
    engine.model.selective_readout = False
    full = run_strategy(engine, groups, "flide").answers
    assert full == want
    # In blocks of 7 rows (readout rows spread over many blocks): still the same answers.
    from flide_ext.models.base import FlatCausalLM

    blocked = FlatCausalLM._full_readout
    monkeypatch.setattr(FlatCausalLM, "_full_readout", lambda self, h, rows: blocked(self, h, rows, block=7))
    assert run_strategy(engine, groups, "flide").answers == want
    with pytest.raises(ValueError, match="strategy 'paged'"):
        run_strategy(engine, groups, "paged")


def test_prefix_cache_keeps_user_checkpoints(tiny_dirs):
    """The strategy's cache is its own: a full store of the user's checkpoints is
    neither evicted nor leaked into, and the strategy still resumes every question."""
    engine = Engine(str(tiny_dirs["qwen3_5"]), checkpoint_capacity=1)
    groups = _groups()
    user = ([list(range(3, 100))], [[1]])
    engine.run_round([user], [True])
    kept = set(engine.checkpoints.entries)
    assert len(kept) == 1
    result = run_strategy(engine, groups, "prefix_cache")
    assert set(engine.checkpoints.entries) == kept
    assert result.stats.resumed_tokens == sum(cached_length(p, True) * len(p) for p, _ in groups) > 0
    with pytest.raises(ValueError, match="grid must be a positive integer"):
        run_strategy(engine, groups, "prefix_cache", grid=2.5)
    assert run_strategy(engine, [([], [])] + groups, "prefix_cache").answers[0] == []
