"""The state cache (flide_ext/runtime/state_cache.py, checkpoints.py): every
step of a growing history answered warm gives the bits of the same request on a
fresh engine with the cache off; eviction never changes an answer or fails a
request; a request resumes only from a prefix it has."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from flide_ext import Engine
from flide_ext.runtime.checkpoints import state_of
from flide_ext.runtime.kv_pool import KVPool, PoolFullError
from flide_ext.runtime.rounds import request_size
from flide_ext.runtime.state_cache import ALIGN, StateCache

FAMILIES = ["qwen3_5", "llama"]
LABELS = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def engines(tiny_dirs):
    """Per family a warm engine (cache on) and a cold one (cache off)."""
    return {f: (Engine(str(tiny_dirs[f])), Engine(str(tiny_dirs[f]), radix_cache=False)) for f in FAMILIES}


def _questions(rng, history, n=3):
    firsts = rng.sample(range(1, 500), n)  # distinct first tokens: the state is the whole history
    return [history + [f] + [rng.randrange(500) for _ in range(rng.randint(0, 3))] for f in firsts]


def _same_as_cold(warm, cold, prompts):
    # What the scheduler packs the request by: its round's stream tokens exactly,
    # and at least its segments.
    predicted = warm.round_size(state_of(prompts), request_size(prompts))
    w = warm.run_round([(prompts, [LABELS] * len(prompts))])
    c = cold.run_round([(prompts, [LABELS] * len(prompts))])
    assert w.answers == c.answers, "warm answers differ from cold"
    assert w.stats.stream_tokens == predicted.tokens and w.stats.segments <= predicted.segments
    assert cold.round_size(state_of(prompts), request_size(prompts)) == request_size(prompts)  # no cache
    return w


@pytest.mark.parametrize("family", FAMILIES)
def test_one_token_growth_across_every_boundary_offset(family, engines):
    """A history growing one token per step from 61 to 130 tokens: its state
    sits at every offset 0..63 from a checkpoint position, and crosses two."""
    warm, cold = engines[family]
    warm.flush_cache()
    rng = random.Random(1)
    history = [rng.randrange(500) for _ in range(60)]
    seen = set()
    for _ in range(70):
        history.append(rng.randrange(500))
        result = _same_as_cold(warm, cold, _questions(rng, history, n=2))
        state = len(history)
        # The cache resumes the state's last checkpoint before the previous step's end.
        assert result.resumed_tokens[0] == (state - 1) // ALIGN * ALIGN
        seen.add(state % ALIGN)
    assert seen == set(range(ALIGN))


@pytest.mark.parametrize("family", FAMILIES)
def test_growing_histories_branches_and_long_steps(family, engines):
    """Growth of 1 to 150 tokens per step, and two branches of one history that
    share its first 100 tokens, stepped alternately."""
    warm, cold = engines[family]
    warm.flush_cache()
    rng = random.Random(2)
    trunk = [rng.randrange(500) for _ in range(100)]
    branches = [list(trunk), list(trunk)]
    for step in range(10):
        for b in branches:
            b += [rng.randrange(500) for _ in range(rng.choice([1, 13, 64, 150]))]
            result = _same_as_cold(warm, cold, _questions(rng, b))
            if step:  # every later step resumes at least the shared trunk's checkpoint
                assert result.resumed_tokens[0] >= 64
    stats = warm.cache_stats()
    assert stats["nodes"] >= 3 and stats["cached_tokens"] > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_two_clients_share_a_system_prompt(family, engines):
    warm, cold = engines[family]
    warm.flush_cache()
    rng = random.Random(3)
    system = [rng.randrange(500) for _ in range(150)]
    resumed = []
    for client in range(3):
        history = system + [rng.randrange(500) for _ in range(30)]
        resumed.append(_same_as_cold(warm, cold, _questions(rng, history)).resumed_tokens[0])
    # The first client computes everything; the third resumes the system
    # prompt's checkpoint (with GDN layers the second cuts its state there).
    assert resumed[0] == 0 and resumed[2] == 128
    # Several requests of one round, some sharing the system prompt.
    groups = []
    for _ in range(4):
        prompts = _questions(rng, system + [rng.randrange(500) for _ in range(rng.randint(1, 90))])
        groups.append((prompts, [LABELS] * len(prompts)))
    assert warm.run_round(groups).answers == cold.run_round(groups).answers


def test_requests_resume_only_prefixes_they_have(engines):
    """Random histories over a 3-token vocabulary (many shared prefixes): each
    request's resumed tokens are its own, and its answers the cold ones."""
    warm, cold = engines["qwen3_5"]
    warm.flush_cache()
    rng = random.Random(4)
    histories = []
    for _ in range(30):
        if histories and rng.random() < 0.6:
            base = rng.choice(histories)
            history = base[: rng.randint(0, len(base))] + [rng.randrange(3) for _ in range(rng.randint(1, 80))]
        else:
            history = [rng.randrange(3) for _ in range(rng.randint(1, 200))]
        histories.append(history)
        prompts = [history + [100 + i] for i in range(2)]
        match = warm.cache.match(np.asarray(history, np.int64), len(history))
        # The resumed prefix's tokens, read back from the tree, are the request's own.
        got = np.concatenate([nd.tokens for nd in match.nodes])[: match.length] if match.length else []
        assert list(got) == history[: match.length]
        result = _same_as_cold(warm, cold, prompts)
        assert result.resumed_tokens[0] == match.length


@pytest.mark.parametrize("family", FAMILIES)
def test_eviction_under_a_tiny_budget(family, tiny_dirs, engines):
    """A budget of a few hundred tokens and two slots, 12 agents stepping in
    turn: memory stays within it, no request fails, answers stay cold ones."""
    _, cold = engines[family]
    probe = Engine(str(tiny_dirs[family]), state_cache_bytes=1 << 20)
    budget = 300 * probe.runner.kv_pool.row_bytes + 2 * probe.runner.slot_bytes
    engine = Engine(str(tiny_dirs[family]), state_cache_bytes=budget)
    rng = random.Random(5)
    agents = [[rng.randrange(500) for _ in range(rng.randint(50, 140))] for _ in range(12)]
    for step in range(3):
        for history in agents:
            history += [rng.randrange(500) for _ in range(rng.randint(1, 70))]
            _same_as_cold(engine, cold, _questions(rng, history))
            stats = engine.cache_stats()
            assert stats["cached_tokens"] <= stats["max_tokens"]
            assert stats["slots"] <= stats["max_slots"]
            assert stats["bytes"] <= budget
    assert engine.cache_stats()["evicted_nodes"] > 0
    # Nothing leaks: the pool's free rows plus the cache's are all the rows.
    pool = engine.runner.kv_pool
    assert pool.num_free + engine.cache_stats()["cached_tokens"] == pool.rows
    engine.flush_cache()
    assert pool.num_free == pool.rows
    if engine.state_pool is not None:
        assert len(engine.state_pool.free) == engine.state_pool.capacity


def test_flush_and_cache_off(engines):
    warm, cold = engines["llama"]
    rng = random.Random(6)
    history = [rng.randrange(500) for _ in range(130)]
    prompts = _questions(rng, history)
    first = _same_as_cold(warm, cold, prompts)
    again = _same_as_cold(warm, cold, prompts)
    assert again.resumed_tokens[0] == 128
    warm.flush_cache()
    assert warm.cache_stats()["cached_tokens"] == 0
    assert _same_as_cold(warm, cold, prompts).resumed_tokens[0] == 0
    assert first.answers == again.answers
    assert cold.cache_stats() == {"enabled": False}
    assert cold.run_round([(prompts, [LABELS] * 3)]).resumed_tokens == [0]
    with pytest.raises(ValueError, match="state_cache_bytes"):
        Engine(str(warm.path), state_cache_bytes=0)


def test_a_failing_round_frees_its_rows_and_slots(tiny_dirs, monkeypatch):
    engine = Engine(str(tiny_dirs["qwen3_5"]))
    rng = random.Random(7)
    history = [rng.randrange(500) for _ in range(150)]
    engine.run_round([(_questions(rng, history), [LABELS] * 3)])
    before = engine.cache_stats()

    def broken(*args, **kwargs):
        raise MemoryError("simulated")

    monkeypatch.setattr(engine.model, "forward", broken)
    with pytest.raises(MemoryError, match="simulated"):
        engine.run_round([(_questions(rng, history + [1] * 70), [LABELS] * 3)])
    monkeypatch.undo()
    pool = engine.runner.kv_pool
    assert engine.cache_stats()["cached_tokens"] == before["cached_tokens"]
    assert pool.num_free + before["cached_tokens"] == pool.rows
    assert len(engine.state_pool.free) == engine.state_pool.capacity - before["slots"]
    assert engine.cache.root.children and all(nd.locks == 0 for nd in engine.cache._walk())


def test_every_route_resumes(char_model_dir):
    """/v1/decisions' form resumes too: the second identical decision request
    hits the cache, with the same answers."""
    engine = Engine(str(char_model_dir))
    request = {"input": "The meeting moved to Thursday at 3 pm. " * 4,
               "questions": [{"id": "colour", "type": "choice", "question": "Colour?",
                              "options": [{"name": "blue"}, {"name": "red"}]},
                             {"id": "day", "type": "choice", "question": "Which day?",
                              "options": [{"name": "Tuesday"}, {"name": "Thursday"}]}]}
    first = engine.decide(request).model_dump()
    hits = engine.cache_stats()["hits"]
    second = engine.decide(request).model_dump()
    assert engine.cache_stats()["hits"] == hits + 1
    assert first["answers"] == second["answers"]


def test_radix_tree_unit():
    pool = KVPool([(1, 2, 2)], torch.float32, "cpu", rows=64)
    cache = StateCache(pool)
    a = np.arange(200, dtype=np.int64)
    b = np.concatenate([np.arange(70), np.arange(1000, 1100)]).astype(np.int64)

    def rows(n):
        taken = pool.allocate(n)
        return lambda lo, hi: taken[lo:hi]

    kept, _ = cache.insert(a[:64], rows(64), -1)
    assert sum(len(k) for k in kept) == 64 and pool.num_free == 0
    with pytest.raises(PoolFullError):
        pool.allocate(1)
    m = cache.match(b, len(b))
    assert m.matched == 64 and m.length == 64  # the whole cached edge (b shares 70 tokens)
    m = cache.match(a[:63], 63)
    assert m.length == 0 and m.matched == 63  # a state shorter than a checkpoint resumes nothing
    cache.evict(rows_needed=10)  # frees the least recently used leaf
    assert cache.nodes == 0 and pool.num_free == 64
    cache.insert(a[:64], rows(64), -1)
    cache.unlock([])
    cache.lock([cache.root.children[0]])
    cache.evict(rows_needed=10)
    assert cache.nodes == 1  # a locked node stays


def test_a_round_larger_than_the_pool_runs_as_with_the_cache_off(tiny_dirs):
    """run_round called directly with a round beyond the round capacity (whose
    rows the pool does not have) answers as the engine without a cache."""
    from flide_ext.protocol.errors import ModelLoadError
    from flide_ext.runtime.capacity import RoundCapacity

    cap = RoundCapacity(tokens=128, segments=64, requests=8)
    rng = random.Random(8)
    history = [rng.randrange(500) for _ in range(300)]
    groups = [(_questions(rng, history, n=2), [LABELS] * 2)]
    small = Engine(str(tiny_dirs["llama"]), round_capacity=cap, state_cache_bytes=5120)
    off = Engine(str(tiny_dirs["llama"]), round_capacity=cap, radix_cache=False)
    assert small.runner.kv_pool.rows < 300
    assert small.run_round(groups).answers == off.run_round(groups).answers
    assert small.runner.kv_pool.num_free == small.runner.kv_pool.rows
    with pytest.raises(ModelLoadError, match="cannot be allocated"):
        Engine(str(tiny_dirs["llama"]), state_cache_bytes=10**16)


def test_eviction_frees_a_margin_so_rounds_at_the_budget_rarely_evict():
    """Over budget by one slot, an eviction frees 1/EVICT_MARGIN of the slots
    besides (least recently used first), so the next insertions evict nothing."""
    from flide_ext.runtime.state_cache import EVICT_MARGIN

    released = []
    cache = StateCache(None, released.extend, max_slots=32, slot_bytes=1)
    state = np.arange(64 * 40, dtype=np.int64) % 1000

    def insert(i):  # 40 distinct 64-token states, each with a slot
        cache.insert(np.concatenate([[5000 + i], state[:63]]), lambda a, b: np.zeros(b - a, np.int64), i)

    for i in range(33):
        insert(i)
    cache.evict()
    margin = 32 // EVICT_MARGIN
    assert cache.slots == 32 - margin and released == list(range(1 + margin))  # the oldest first
    for i in range(33, 33 + margin):
        insert(i)
        cache.evict()
    assert cache.slots == 32 and cache.evicted_nodes == 1 + margin  # nothing more was evicted


def test_a_growing_history_keeps_its_newest_checkpoint_under_a_tight_budget(tiny_dirs, engines):
    """Two GDN slots, one agent growing 100 tokens a step: each step resumes the
    checkpoint the step before left (an eviction takes the stale ancestors' slots
    first, not the newest one, which was used in the same round), with cold answers."""
    _, cold = engines["qwen3_5"]
    probe = Engine(str(tiny_dirs["qwen3_5"]), state_cache_bytes=1 << 20)
    engine = Engine(str(tiny_dirs["qwen3_5"]),
                    state_cache_bytes=1000 * probe.runner.kv_pool.row_bytes + 2 * probe.runner.slot_bytes)
    assert engine.cache_stats()["max_slots"] == 2
    rng = random.Random(8)
    history = [rng.randrange(500) for _ in range(900)]
    for n in range(100, 901, 100):
        result = _same_as_cold(engine, cold, [history[:n] + [7]])
        assert result.resumed_tokens[0] == (0 if n == 100 else (n - 100) // ALIGN * ALIGN), n
        assert engine.cache_stats()["slots"] <= 2


def test_a_request_without_prompts_beside_others(tiny_dirs):
    """A request with no prompts is answered with none, also beside a request
    that resumes or keeps checkpoints."""
    engine = Engine(str(tiny_dirs["qwen3_5"]))
    rng = random.Random(11)
    history = [rng.randrange(500) for _ in range(130)]
    first = engine.run_round([(_questions(rng, history), [LABELS] * 3), ([], [])])
    assert first.answers[1] == [] and len(first.answers[0]) == 3
    again = engine.run_round([([], []), (_questions(rng, history + [3] * 10), [LABELS] * 3)])
    assert again.answers[0] == [] and again.resumed_tokens[1] == 128
