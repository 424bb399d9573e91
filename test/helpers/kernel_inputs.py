"""Inputs for the kernel tests: random rounds and fork-attention arguments, and
hand-made segment tables (levels of segments with their state slots)."""

from __future__ import annotations

import torch


def attention_args(plan, Hq, Hkv, D, DV, gen, prefix=0):
    T = plan.num_tokens
    q = torch.randn(T, Hq, D, generator=gen)
    k = torch.randn(prefix + T, Hkv, D, generator=gen)
    v = torch.randn(prefix + T, Hkv, DV, generator=gen)
    return (q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
            plan.positions, plan.kv_positions, D**-0.5)


def random_prompts(gen, requests=3):
    prompts, owners = [], []
    for r in range(requests):
        state = torch.randint(0, 50, (int(torch.randint(1, 90, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(int(torch.randint(1, 5, (1,), generator=gen))):
            n = int(torch.randint(1, 9, (1,), generator=gen))  # 1-token questions included
            prompts.append(state + (100 + torch.randint(0, 50, (n,), generator=gen)).tolist())
            owners.append(r)
    return owners, prompts


def segment_table():
    # Level of roots (one shorter than the conv history) then a level of children.
    starts = torch.tensor([0, 9, 11, 12, 12, 19])
    lens = torch.tensor([9, 2, 1, 0, 7, 4])
    parent_slot = torch.tensor([-1, -1, -1, 0, 1, 2])
    slot = torch.tensor([0, 1, 2, 3, -1, 4])
    return starts, lens, parent_slot, slot


def tree_levels():
    # Roots: a 130-row state from zeros and a 70-row state resumed from slot 5;
    # then questions (a 1-row one, an empty one, one with no kept state); then a
    # third level, one of whose parents is the empty segment.
    t = torch.tensor
    return [
        (t([0, 130]), t([130, 70]), t([-1, 5]), t([0, 1])),
        (t([200, 265, 266, 266]), t([65, 1, 0, 34]), t([0, 0, 1, 1]), t([2, 3, 4, -1])),
        (t([300, 340]), t([40, 8]), t([2, 4]), t([6, 7])),
    ]


TREE_ROWS = 348
"""The rows :func:`tree_levels` spans."""
