"""A round cut short (``Engine.run_round(..., cancelled=...)``, what the
scheduler does once every client of a running round has gone): it stops after
the layer it is in, gives every pool row and slot back, keeps no checkpoint
(with room to spare, the state cache is as it found it), and the rounds after it answer the bits a fresh engine gives."""

from __future__ import annotations

import random

import pytest

from flide_ext import Engine
from flide_ext.runtime.round_result import RoundCancelled

FAMILIES = ["llama", "qwen3_5"]  # attention only; GDN slots too
LABELS = [5, 6, 7, 8]


def _after(k: int):
    """A ``cancelled`` that is false the first ``k`` times it is asked (once
    before each layer), then true; ``.asked`` counts the calls."""

    def cancelled():
        cancelled.asked += 1
        return cancelled.asked > k

    cancelled.asked = 0
    return cancelled


def _pools(engine: Engine):
    # What a round borrows: K/V rows, GDN slots (the pool's free list), and the cache's contents.
    slots = sorted(engine.state_pool.free) if engine.state_pool is not None else None
    return engine.runner.kv_pool.num_free, slots, engine.cache_stats()


def _rounds(seed: int = 3):
    # A history long enough to leave checkpoints (two ALIGN positions), the
    # round to cut (one request resuming that history, one cold), and a round
    # after it that resumes the history again.
    rng = random.Random(seed)
    history = [rng.randrange(500) for _ in range(140)]

    def request(prefix, n):
        return [prefix + [rng.randrange(500) for _ in range(rng.randint(1, 4))] for _ in range(n)], [LABELS] * n

    first = [request(history, 3)]
    longer = history + [rng.randrange(500) for _ in range(70)]
    cut = [request(longer, 2), request([rng.randrange(500) for _ in range(90)], 2)]
    after = [request(longer, 3), request(history, 1)]
    return first, cut, after


@pytest.mark.parametrize("family", FAMILIES)
def test_a_cut_round_stops_early_frees_everything_and_changes_no_later_bit(family, tiny_dirs):
    first, cut, after = _rounds()
    engine = Engine(str(tiny_dirs[family]))
    layers = len(engine.model.model.layers)
    engine.run_round(first)
    before = _pools(engine)
    assert before[2]["nodes"] > 0  # the cut round has checkpoints to resume from

    k = layers // 2
    cancelled = _after(k)
    with pytest.raises(RoundCancelled) as raised:
        engine.run_round(cut, cancelled)
    assert cancelled.asked == k + 1, "asked once before each layer run, then stopped"
    assert (raised.value.layers_run, raised.value.layers) == (k, layers)
    assert raised.value.requests == 2 and raised.value.questions == 4
    assert raised.value.stream_tokens > 0
    assert _pools(engine) == before  # rows, slots, nodes, hits: as it found them

    fresh = Engine(str(tiny_dirs[family]))
    fresh.run_round(first)
    got, want = engine.run_round(after), fresh.run_round(after)
    assert got.answers == want.answers  # float equality: the bits
    assert (got.resumed_tokens, got.kept_tokens) == (want.resumed_tokens, want.kept_tokens)
    assert got.resumed_tokens[0] > 0  # it resumed from the checkpoints the cut round found
    (rows, slots, stats), (fresh_rows, fresh_slots, fresh_stats) = _pools(engine), _pools(fresh)
    # Which slot ids are free depends on the order they came back in; how many does not.
    assert (rows, stats) == (fresh_rows, fresh_stats) and len(slots or ()) == len(fresh_slots or ())


@pytest.mark.parametrize("family", FAMILIES)
def test_a_cut_before_the_first_layer_and_one_never_made(family, tiny_dirs):
    """``cancelled`` true at once stops before any layer; one that stays false
    is asked before every layer and changes no bit of the round."""
    first, cut, _ = _rounds(4)
    engine = Engine(str(tiny_dirs[family]))
    layers = len(engine.model.model.layers)
    engine.run_round(first)
    before = _pools(engine)
    with pytest.raises(RoundCancelled) as raised:
        engine.run_round(cut, lambda: True)
    assert raised.value.layers_run == 0 and _pools(engine) == before

    never = _after(layers)
    asked = engine.run_round(cut, never)
    assert never.asked == layers
    fresh = Engine(str(tiny_dirs[family]))
    fresh.run_round(first)
    plain = fresh.run_round(cut)
    assert asked.answers == plain.answers and asked.kept_tokens == plain.kept_tokens
