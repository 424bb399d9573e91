"""The scheduler's messages (flide_ext/server/io_struct.py): a request's prompts
travel as their shared prefix and each one's rest."""

from __future__ import annotations

import pickle

import numpy as np

from flide_ext.plan.tree import build_prefix_tree
from flide_ext.runtime.checkpoints import state_of
from flide_ext.server.io_struct import ScoreWork


def test_pack_splits_at_the_common_prefix_and_restores_the_prompts():
    rng = np.random.default_rng(0)
    history = rng.integers(0, 1000, 5000)
    cases = {
        "questions after a history": [np.concatenate((history, rng.integers(0, 1000, 7))) for _ in range(10)],
        "one prompt": [history.copy()],
        "a prompt that is another's prefix": [history[:300].copy(), history[:450].copy()],
        "no common first token": [np.array([1, 2, 3]), np.array([4, 5])],
        "identical prompts": [history[:64].copy(), history[:64].copy()],
    }
    for name, prompts in cases.items():
        work = pickle.loads(pickle.dumps(ScoreWork.pack(7, prompts, [[1, 2]] * len(prompts))))
        assert work.rid == 7 and work.labels == [[1, 2]] * len(prompts) and work.sent > 0, name
        assert all(np.array_equal(a, b) and a.dtype == np.int64 for a, b in zip(work.prompts, prompts)), name
        assert len(work.prompts) == len(prompts), name
        # The state the scheduler hands the engine with the prompts is the one
        # the engine would compute from them.
        assert np.array_equal(work.state, state_of(prompts)) and work.state.dtype == np.int64, name
        # The manager splits them where its prefix tree's root ends: the same place.
        tree = build_prefix_tree([0] * len(prompts), prompts)
        assert tree.shared_tokens == len(work.shared), name
        assert np.array_equal(ScoreWork.pack(7, prompts, [[1]] * len(prompts), shared=tree.shared_tokens).shared,
                              work.shared), name
        # The prefix is the longest every prompt shares.
        n = len(work.shared)
        assert all(np.array_equal(p[:n], work.shared) for p in prompts), name
        if all(len(p) > n for p in prompts):
            assert len({int(p[n]) for p in prompts}) > 1, name
    # The history is pickled once, not once per question.
    many = cases["questions after a history"]
    assert len(pickle.dumps(ScoreWork.pack(0, many, [[1]] * 10))) < 2 * history.nbytes
