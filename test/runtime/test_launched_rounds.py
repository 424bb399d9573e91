"""Rounds in two halves (flide_ext/runtime/launched_round.py): a round launched
while another is in flight, as the scheduler's overlap runs them, gives every
question the bits it gets from rounds run one at a time; the later round
resumes from the checkpoints the earlier one keeps; pools and cache locks come
back as after sequential rounds, also when a launch fails between the two; a
launch short of K/V rows or GDN slots completes the round in flight first."""

from __future__ import annotations

import random

import pytest

from flide_ext import Engine
from flide_ext.runtime.round_result import RoundCancelled

FAMILIES = ["qwen3_5", "llama"]
LABELS = [5, 6, 7, 8]


def _request(rng, history, n=3):
    firsts = rng.sample(range(1, 500), n)
    return ([history + [f] + [rng.randrange(500) for _ in range(rng.randint(0, 4))] for f in firsts], [LABELS] * n)


def _pools(engine):
    cache = engine.cache
    return (engine.runner.kv_pool.num_free, len(engine.state_pool.free) if engine.state_pool else None,
            engine.cache_stats()["cached_tokens"], all(nd.locks == 0 for nd in cache._walk()))


@pytest.mark.parametrize("family", FAMILIES)
def test_overlapped_rounds_answer_as_sequential_ones(family, tiny_dirs):
    """An agent's step launched while its previous step is in flight resumes
    from the checkpoint that step keeps; every answer, stream and resumed token
    count equals the same rounds run one at a time on a fresh engine."""
    rng = random.Random(3)
    history = [rng.randrange(500) for _ in range(140)]
    other = [rng.randrange(500) for _ in range(90)]
    steps = []
    for _ in range(4):
        steps.append([_request(rng, history), _request(rng, other, n=2)])
        history = history + [rng.randrange(500) for _ in range(rng.choice([3, 40, 70]))]
        other = other + [rng.randrange(500) for _ in range(5)]

    sequential = Engine(str(tiny_dirs[family]))
    expected = [sequential.run_round(groups) for groups in steps]

    overlapped = Engine(str(tiny_dirs[family]))
    results, flight = [], None
    for groups in steps:
        launched = overlapped.launch_round(groups)
        if flight is not None:
            results.append(overlapped.complete_round(flight))
        flight = launched
    results.append(overlapped.complete_round(flight))

    for got, want in zip(results, expected):
        assert got.answers == want.answers
        assert got.stream_tokens == want.stream_tokens and got.resumed_tokens == want.resumed_tokens
    # Steps after the first resumed their history from the step launched before them.
    assert all(r.resumed_tokens[0] >= 128 for r in results[1:])
    assert _pools(overlapped) == _pools(sequential)


def test_a_failing_launch_beside_a_round_in_flight(tiny_dirs):
    """A launch refused (a label outside the vocabulary) or cancelled while a
    round is in flight takes nothing with it: the round in flight answers as
    alone, and every row, slot and lock comes back."""
    rng = random.Random(4)
    history = [rng.randrange(500) for _ in range(150)]
    first = [_request(rng, history)]
    alone = Engine(str(tiny_dirs["qwen3_5"]))
    want = alone.run_round(first)

    engine = Engine(str(tiny_dirs["qwen3_5"]))
    flight = engine.launch_round(first)
    prompts, _ = _request(rng, history + [1] * 70)
    with pytest.raises(ValueError, match="label token ids"):
        engine.launch_round([(prompts, [[5, 10 ** 7]] * len(prompts))])
    with pytest.raises(RoundCancelled):
        engine.launch_round([(prompts, [LABELS] * len(prompts))], cancelled=lambda: True)
    got = engine.complete_round(flight)
    assert got.answers == want.answers
    assert _pools(engine) == _pools(alone)


def test_run_round_is_launch_then_complete(tiny_dirs):
    """run_round's stats come from the two halves: stages add up and a round
    with no prompts is answered at its launch."""
    engine = Engine(str(tiny_dirs["llama"]))
    rng = random.Random(5)
    launched = engine.launch_round([([], []), _request(rng, [rng.randrange(500) for _ in range(30)])])
    result = engine.complete_round(launched)
    assert result.answers[0] == [] and len(result.answers[1]) == 3
    stats = result.stats
    assert stats.plan_seconds > 0 and stats.forward_seconds > 0 and stats.finish_seconds > 0
    empty = engine.complete_round(engine.launch_round([([], [])]))
    assert empty.answers == [[]] and empty.stats.requests == 1


def _pair(rounds, engine_of):
    # The same two rounds on two fresh engines: one at a time, then the second
    # launched while the first is in flight.
    sequential = engine_of()
    want = [sequential.run_round(groups) for groups in rounds]
    overlapped = engine_of()
    first = overlapped.launch_round(rounds[0])
    second = overlapped.launch_round(rounds[1])
    got = [overlapped.complete_round(first), overlapped.complete_round(second)]
    return sequential, want, overlapped, got


def test_a_launch_short_of_rows_completes_the_round_in_flight(tiny_dirs):
    """A small cache mostly held by the round in flight: the next round, whose
    agents resume 896 cached tokens each, would find too few free K/V rows and
    run without the cache (far past the round capacity); it completes the
    round in flight first and resumes as one-at-a-time rounds do. Completing a
    round again returns its result and returns no row twice."""
    from flide_ext.runtime.capacity import RoundCapacity

    rng = random.Random(1)
    tokens = lambda n: [rng.randrange(500) for _ in range(n)]  # noqa: E731
    agents, passage = [tokens(900) for _ in range(3)], tokens(330)
    questions = [tokens(95) for _ in range(10)]

    def engine_of():
        engine = Engine(str(tiny_dirs["llama"]), state_cache_bytes=3008 * 512, round_capacity=RoundCapacity(tokens=1024))
        for history in agents + [passage]:
            engine.run_round([([history + [1]], [LABELS])])
        return engine

    rounds = [[([passage + q for q in questions], [LABELS] * 10)],
              [([history + [2] * 35], [LABELS]) for history in agents]]
    sequential, want, overlapped, got = _pair(rounds, engine_of)
    assert want[1].resumed_tokens == [896, 896, 896]
    for g, w in zip(got, want):
        assert g.answers == w.answers
        assert g.resumed_tokens == w.resumed_tokens and g.stream_tokens == w.stream_tokens
    assert overlapped.early_completions == 1 and sequential.early_completions == 0
    assert _pools(overlapped) == _pools(sequential)
    launched = overlapped.launch_round(rounds[0])
    once = overlapped.complete_round(launched)
    free = overlapped.runner.kv_pool.num_free
    assert overlapped.complete_round(launched) is once
    assert overlapped.runner.kv_pool.num_free == free


@pytest.mark.parametrize("radix_cache", [True, False])
def test_a_launch_short_of_slots_completes_the_round_in_flight(tiny_dirs, radix_cache):
    """Two rounds of states whose GDN slots together pass the pool's: the later
    launch completes the round in flight before the pool would grow (on the GPU
    growing replaces the pool's tensors and every graph is captured again)."""
    rng = random.Random(2)
    tokens = lambda n: [rng.randrange(500) for _ in range(n)]  # noqa: E731
    rounds = [[([state + tokens(3) for _ in range(2)], [LABELS] * 2) for state in [tokens(60) for _ in range(n)]]
              for n in (6, 5)]
    engine_of = lambda: Engine(str(tiny_dirs["qwen3_5"]), radix_cache=radix_cache)  # noqa: E731
    sequential, want, overlapped, got = _pair(rounds, engine_of)
    assert [g.answers for g in got] == [w.answers for w in want]
    assert overlapped.early_completions == 1
    assert overlapped.state_pool.capacity == sequential.state_pool.capacity


def test_flush_cache_completes_the_rounds_in_flight(tiny_dirs):
    """A flush with a round in flight waits for it: the round answers as alone,
    and afterwards the cache holds nothing and every row and slot is free."""
    rng = random.Random(6)
    groups = [_request(rng, [rng.randrange(500) for _ in range(120)])]
    want = Engine(str(tiny_dirs["qwen3_5"])).run_round(groups)
    engine = Engine(str(tiny_dirs["qwen3_5"]))
    flight = engine.launch_round(groups)
    engine.flush_cache()
    assert engine.early_completions == 1
    assert engine.complete_round(flight).answers == want.answers
    assert engine.cache_stats()["cached_tokens"] == 0 and engine.cache_stats()["slots"] == 0
    assert engine.runner.kv_pool.num_free == engine.runner.kv_pool.rows
    assert engine.state_pool.num_free == engine.state_pool.capacity
