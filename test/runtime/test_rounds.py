"""Rounds under a token and a segment capacity (flide_ext/runtime/rounds.py)."""

from __future__ import annotations

import pytest
import torch

from flide_ext.protocol.errors import RequestError
from flide_ext.plan.flat import plan_round
from flide_ext.runtime.rounds import RequestSize, RoundCapacity, pack_round, request_size


def test_request_size_is_the_requests_plan():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        state = torch.randint(0, 9, (int(torch.randint(1, 30, (1,), generator=gen)),), generator=gen).tolist()
        prompts = [state + torch.randint(0, 9, (int(torch.randint(0, 6, (1,), generator=gen)),), generator=gen).tolist()
                   for _ in range(int(torch.randint(1, 6, (1,), generator=gen)))]
        plan = plan_round([0] * len(prompts), prompts)
        assert request_size(prompts) == RequestSize(plan.num_tokens, plan.num_segments)


def test_pack_round_takes_every_request_that_still_fits():
    cap = RoundCapacity(tokens=100, segments=10, requests=3)
    sizes = [RequestSize(60, 2), RequestSize(50, 2), RequestSize(40, 3), None, RequestSize(1, 1), RequestSize(1, 1)]
    # 60 fits; 50 would make 110: waits; 40 fits (100); the refused one is skipped;
    # the 1-token one no longer fits the tokens.
    assert pack_round(sizes, cap) == [0, 2]
    # The segment capacity binds the same way, and the request capacity.
    assert pack_round([RequestSize(1, 6), RequestSize(1, 6), RequestSize(1, 4)], cap) == [0, 2]
    assert pack_round([RequestSize(1, 1)] * 5, cap) == [0, 1, 2]
    assert pack_round([], cap) == []


def test_capacity_checks():
    cap = RoundCapacity(tokens=10, segments=2)
    cap.check(RequestSize(10, 2))
    with pytest.raises(RequestError, match="needs 11 stream tokens in 1 segments") as e:
        cap.check(RequestSize(11, 1), "questions")
    assert e.value.field == "questions"
    with pytest.raises(RequestError, match="2 segments"):
        cap.check(RequestSize(3, 3))
    for bad in ({"tokens": 0}, {"segments": -1}, {"requests": 1.5}, {"tokens": True}):
        with pytest.raises(ValueError, match="positive integer"):
            RoundCapacity(**bad)


def test_engine_splits_batches_into_rounds_and_refuses_oversized(tiny_dirs):
    """A batch larger than a round runs as several rounds with the same answers;
    a request no round can hold gets its RequestError and the others are answered."""
    from flide_ext import Engine

    gen = torch.Generator().manual_seed(1)
    state = torch.randint(3, 200, (30,), generator=gen).tolist()
    requests = [{"prompts": [state + [i, 7], state + [i, 8, 9]], "label_token_ids": [1, 2]} for i in range(5)]
    big = {"prompts": [list(range(3, 80))], "label_token_ids": [1]}
    wide = Engine(str(tiny_dirs["qwen3_5"]))
    want = wide.score_tokens_batch(requests)
    assert want.stats.requests == 5
    narrow = Engine(str(tiny_dirs["qwen3_5"]), round_capacity=RoundCapacity(tokens=70, segments=6))
    rounds, run_round = [], narrow.run_round
    narrow.run_round = lambda groups, **kw: rounds.append(len(groups)) or run_round(groups, **kw)
    got = narrow.score_tokens_batch(requests[:2] + [big] + requests[2:])
    assert isinstance(got[2], RequestError) and got[2].field == "prompts"
    assert "needs 77 stream tokens" in got[2].message
    answers = got[:2] + got[3:]
    assert all(a.label_logprobs == b.label_logprobs for a, b in zip(answers, want))
    # 34 tokens in 3 segments each: two per round, so three rounds, and the
    # batch's stats are the rounds' together.
    assert rounds == [2, 2, 1]
    assert got.stats.requests == 5 and got.stats.stream_tokens == want.stats.stream_tokens


def test_resize_measures_waiting_requests_again():
    """The scheduler re-measures waiting requests before each round (what they
    resume may have changed): sizes are replaced, and those no round holds now
    leave the queue with a RequestError naming their field."""
    from flide_ext.runtime.rounds import RoundQueue

    queue = RoundQueue(RoundCapacity(tokens=100, segments=10))
    for name, tokens in (("a", 90), ("b", 80), ("c", 70)):
        queue.put(name, RequestSize(tokens, 2), field=f"items of {name}")
    assert queue.next_round() == ["a"]  # 90 + 80 > 100
    sizes = {"b": RequestSize(30, 2), "c": RequestSize(150, 2)}  # b now resumes; c's checkpoint was evicted
    refused = queue.resize(lambda item: sizes[item])
    assert [(item, e.field) for item, e in refused] == [("c", "items of c")] and "150 stream tokens" in refused[0][1].message
    assert len(queue) == 1 and queue.next_round() == ["b"] and queue.next_round() == []


def test_a_token_budget_caps_a_round_but_the_first_request_always_goes():
    cap = RoundCapacity(tokens=100, segments=10, requests=8)
    sizes = [RequestSize(30, 1), RequestSize(30, 1), RequestSize(50, 1), RequestSize(10, 1)]
    assert pack_round(sizes, cap) == [0, 1, 3]  # the capacity alone: 30 + 30 (+ 50 > 100) + 10
    assert pack_round(sizes, cap, budget=65) == [0, 1]  # 30 + 30; the 50 and the 10 would pass 65
    assert pack_round(sizes, cap, budget=40) == [0, 3]
    assert pack_round(sizes, cap, budget=0) == [0]  # over any budget, the first still goes
    assert pack_round([None, RequestSize(90, 1), RequestSize(5, 1)], cap, budget=10) == [1]
    assert pack_round(sizes, cap, budget=10**9) == pack_round(sizes, cap)  # never above the capacity


def test_remove_withdraws_waiting_items():
    from flide_ext.runtime.rounds import RoundQueue

    queue = RoundQueue(RoundCapacity(tokens=100, segments=10))
    for name in "abcd":
        queue.put(name, RequestSize(60, 1))
    assert queue.remove(lambda item: item in "bd") == ["b", "d"]
    assert queue.remove(lambda item: item == "z") == []
    assert queue.next_round() == ["a"] and queue.next_round() == ["c"] and len(queue) == 0


def test_round_pace_from_past_rounds():
    """Seconds per stream token, token-weighted, each older round at half the
    weight of the next: the budget follows a change of pace within rounds."""
    from flide_ext.runtime.rounds import RoundPace

    pace = RoundPace(seconds=2.0)
    assert pace.budget() == 0  # nothing measured: the first request alone
    pace.observe(1000, 1.0)
    assert pace.budget() == 2000
    pace.observe(0, 5.0)  # an empty round says nothing about tokens
    assert pace.budget() == 2000
    pace.observe(1000, 4.0)  # 4x slower now: (0.5 + 4) s over (500 + 1000) tokens
    assert pace.budget() == int(2.0 * 1500 / 4.5)
    for _ in range(20):
        pace.observe(1000, 4.0)
    assert abs(pace.budget() - 500) <= 1
    with pytest.raises(ValueError, match="positive"):
        RoundPace(0)
