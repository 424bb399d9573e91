"""The start-up warm-up: rounds that fit the engine, exercise the state cache,
and leave no trace in later answers."""

from __future__ import annotations

import numpy as np
import pytest

from flide_ext import Engine
from flide_ext.runtime.capacity import RoundCapacity
from flide_ext.runtime.rounds import request_size
from flide_ext.runtime.warmup import warm_up, warmup_rounds


@pytest.mark.parametrize("context, tokens, segments", [(40960, 65536, 4096), (200, 512, 64), (9, 24, 4)])
def test_rounds_fit_the_context_and_the_round_capacity(context, tokens, segments):
    rounds = warmup_rounds(512, context, tokens, segments)
    assert rounds == warmup_rounds(512, context, tokens, segments)  # the same at every start
    assert len(rounds) == 7
    capacity = RoundCapacity(tokens, segments)
    for groups in rounds:
        for prompts, labels in groups:
            assert prompts and len(labels) == len(prompts)
            assert all(1 <= len(p) < context for p in prompts)
            assert all(0 <= t < 512 for p in prompts for t in p)
            capacity.check(request_size(prompts))  # raises if no round holds it


def test_full_sized_rounds_are_the_workloads_shapes():
    rounds = warmup_rounds(151936, 40960, 65536, 4096)
    # A RACE-like question alone, a MultiRC-like state forked to 30 questions, a
    # RACE-like burst of 35 requests, lengths neither all odd nor all multiples of 16.
    assert [len(p) for p in rounds[0][0][0]] == [465]
    assert len(rounds[3][0][0]) == 30 and len(rounds[-1]) == 35
    lengths = {len(p) % 16 == 0 for groups in rounds for prompts, _ in groups for p in prompts}
    assert lengths == {True, False}


@pytest.mark.parametrize("family", ["qwen3_5", "llama"])
def test_warm_up_resumes_from_the_cache_then_leaves_no_trace(tiny_dirs, family):
    warmed = Engine(str(tiny_dirs[family]), context_length=160, round_capacity=RoundCapacity(384, 64, 16))
    fresh = Engine(str(tiny_dirs[family]), context_length=160, round_capacity=RoundCapacity(384, 64, 16))
    report = warm_up(warmed)
    assert report.rounds >= 7 and report.eager_rounds == report.rounds and report.graph_rounds == 0
    assert report.stream_tokens > 0 and report.seconds > 0
    assert report.resumed_tokens > 0  # the resumed round found the forked round's state
    stats = warmed.cache_stats()
    assert stats["nodes"] == 0 and stats["cached_tokens"] == 0  # emptied after
    rng = np.random.default_rng(7)
    state = rng.integers(0, 512, 90).tolist()
    groups = [([state + [q, 3], state + [q + 1]], [[5, 6], [7, 8]]) for q in (10, 20)]
    for _ in range(2):  # cold, then resumed from the cache
        assert warmed.run_round(groups).answers == fresh.run_round(groups).answers
