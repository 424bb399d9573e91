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
    assert cached_length(prompts) == 128  # checkpoints sit at multiples of 64 tokens
    assert cached_length([list(range(64)), list(range(64)) + [1]]) == 0  # a question keeps a token: 63 shared
    assert cached_length([list(range(65)), list(range(65)) + [1]]) == 64
    assert cached_length([[1, 2]]) == 0


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
        if strategy == "prefix_cache":  # every question resumed from its request's cached state
            assert engine.cache_stats()["nodes"] == 0  # the strategy's cache entries are gone
            assert result.stats.resumed_tokens == sum(cached_length(prompts) * len(prompts) for prompts, _ in groups) > 0
            # Tokens computed: each cached state (and one token more) once, then every question's uncached rest.
            assert result.stats.stream_tokens == sum(
                (cached_length(prompts) + 1 if cached_length(prompts) else 0)
                + sum(len(p) - cached_length(prompts) for p in prompts) for prompts, _ in groups)
    # no_fork recomputes every state per question: more stream tokens than Flide.
    no_fork = run_strategy(engine, groups, "no_fork")
    assert no_fork.stats.stream_tokens == sum(len(p) for prompts, _ in groups for p in prompts) > stream
    engine.model.selective_readout = False
    full = run_strategy(engine, groups, "flide").answers
    assert full == want
    # In blocks of 7 rows (readout rows spread over many blocks): still the same answers.
    monkeypatch.setattr(engine.model, "full_readout_block", 7)
    assert run_strategy(engine, groups, "flide").answers == want
    with pytest.raises(ValueError, match="strategy 'paged'"):
        run_strategy(engine, groups, "paged")


def test_prefix_cache_needs_the_state_cache(tiny_dirs):
    """prefix_cache runs on the engine's own cache (emptied before and after);
    no_fork never resumes, even from a warm cache."""
    engine = Engine(str(tiny_dirs["qwen3_5"]))
    groups = _groups()
    engine.run_rounds(groups)  # the cache now holds the states
    assert engine.cache_stats()["cached_tokens"] > 0
    assert run_strategy(engine, groups, "no_fork").stats.resumed_tokens == 0
    assert engine.cache_stats()["cached_tokens"] > 0  # no_fork leaves the cache as it was
    run_strategy(engine, groups, "prefix_cache")
    assert engine.cache_stats()["cached_tokens"] == 0
    assert run_strategy(engine, [([], [])] + groups, "prefix_cache").answers[0] == []
    off = Engine(str(tiny_dirs["qwen3_5"]), radix_cache=False)
    with pytest.raises(ValueError, match="prefix_cache runs on the engine's state cache"):
        run_strategy(off, groups, "prefix_cache")
