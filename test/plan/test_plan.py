"""The prefix tree and its flat stream (no model involved)."""

from __future__ import annotations

import random

import pytest

from flide_ext.plan.flat import plan_round


def check_plan(requests, prompts):
    """Properties every plan must have, checked against the prompts themselves."""
    plan = plan_round(requests, prompts)
    ids = plan.token_ids.tolist()
    pos = plan.positions.tolist()
    seg_of = plan.token_segment.tolist()
    parent, start, length = plan.seg_parent.tolist(), plan.seg_start.tolist(), plan.seg_len.tolist()
    logical, request, depth = plan.seg_logical_start.tolist(), plan.seg_request.tolist(), plan.seg_depth.tolist()
    rows = plan.readout_rows.tolist()
    # Segments tile the stream back to back, in level order.
    assert start == [sum(length[:s]) for s in range(len(length))]
    assert sum(length) == len(ids) == len(pos) == len(seg_of)
    for s in range(len(start)):
        assert length[s] >= 1
        assert seg_of[start[s] : start[s] + length[s]] == [s] * length[s]
        assert pos[start[s] : start[s] + length[s]] == list(range(logical[s], logical[s] + length[s]))
        if parent[s] >= 0:
            p = parent[s]
            assert p < s and depth[s] == depth[p] + 1 and request[s] == request[p]
            assert logical[s] == logical[p] + length[p]
        else:
            assert depth[s] == 0 and logical[s] == 0
    assert depth == sorted(depth)
    # Siblings part at their first token (maximal sharing inside a request).
    firsts = {}
    for s in range(len(start)):
        key = (request[s], parent[s], ids[start[s]])
        assert key not in firsts, "two siblings start with the same token"
        firsts[key] = s
    # Each prompt is exactly the tokens on its readout row's segment path.
    for i, prompt in enumerate(prompts):
        row = rows[plan.prompt_readout[i]]
        s = seg_of[row]
        assert row == start[s] + length[s] - 1
        assert request[s] == requests[i]
        path = []
        while s >= 0:
            path.append(s)
            s = parent[s]
        tokens = [t for a in reversed(path) for t in ids[start[a] : start[a] + length[a]]]
        assert tokens == list(prompt)
        assert pos[row] == len(prompt) - 1
    # The stream holds each distinct (request, prefix) once: the fewest tokens possible.
    distinct = {(r, tuple(p[:n])) for r, p in zip(requests, prompts) for n in range(1, len(p) + 1)}
    assert len(ids) == len(distinct)
    return plan


def test_one_prompt():
    plan = check_plan([0], [[5, 6, 7]])
    assert plan.num_segments == 1 and plan.readout_rows.tolist() == [2]


def test_duplicate_prompts_share_a_readout_row():
    plan = check_plan([0, 0], [[1, 2, 3], [1, 2, 3]])
    assert plan.num_tokens == 3
    assert plan.prompt_readout.tolist() == [0, 0]


def test_prompt_that_is_a_prefix_of_another():
    plan = check_plan([0, 0], [[1, 2, 3, 4, 5], [1, 2, 3]])
    assert plan.seg_len.tolist() == [3, 2]
    assert plan.readout_rows.tolist() == [2, 4]


def test_question_equal_to_the_shared_prefix():
    state = [9, 8, 7, 6]
    plan = check_plan([0, 0, 0], [state, state + [1], state + [2, 3]])
    assert plan.seg_len.tolist() == [4, 1, 2]
    assert plan.num_levels == 2


def test_requests_never_share_segments():
    state = [4, 4, 4, 4]
    plan = check_plan([0, 1, 1], [state + [1], state + [2], state + [3]])
    assert plan.seg_request.tolist() == [0, 1, 1, 1]
    assert plan.num_tokens == 5 + 4 + 1 + 1


def test_depth_three_tree():
    state, q = [1, 2, 3], [10, 11]
    prompts = [state + q + [20], state + q + [21, 22], state + [12], state + q]
    plan = check_plan([0] * 4, prompts)
    assert plan.num_levels == 3


def test_prompts_that_part_at_the_first_token():
    plan = check_plan([0, 0], [[1, 2], [3, 4]])
    assert plan.seg_parent.tolist() == [-1, -1]


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="at least one token"):
        plan_round([0], [[]])


@pytest.mark.parametrize("seed", range(20))
def test_random_rounds(seed):
    rng = random.Random(seed)
    requests, prompts = [], []
    for r in range(rng.randint(1, 4)):
        state = [rng.randrange(6) for _ in range(rng.randint(1, 12))]
        for _ in range(rng.randint(1, 8)):
            cut = rng.randint(0, len(state))
            prompts.append(state[:cut] + [rng.randrange(4) for _ in range(rng.randint(0 if cut else 1, 5))])
            requests.append(r)
    check_plan(requests, prompts)
