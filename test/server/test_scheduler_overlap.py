"""The scheduler's overlap (flide_ext/server/scheduler.py): with the next round
launched before the one in flight is completed, a burst of agents' steps, several
rounds long, is answered as each step alone on an engine without a cache, and
later steps resume from the states earlier rounds left; a request no round
holds is refused on its own; then the scheduler goes idle and answers again."""

from __future__ import annotations

import multiprocessing
import random

import numpy as np
import pytest
import zmq

from flide_ext import Engine
from flide_ext.runtime.capacity import RoundCapacity
from flide_ext.server.io_struct import SchedulerReady, ScoreDone, ScoreWork
from flide_ext.server.scheduler import run_scheduler

LABELS = [1, 2, 3]


def _steps(rng, agents: int, steps: int) -> list:
    # Per agent, its steps' prompts: a history grown each step, three questions on it.
    out = []
    for _ in range(agents):
        history = [rng.randrange(3, 60) for _ in range(70)]
        for _ in range(steps):
            history = history + [rng.randrange(3, 60) for _ in range(rng.choice([2, 30, 66]))]
            out.append([np.array(history + [q, rng.randrange(3, 60)], dtype=np.int64) for q in (61, 62, 63)])
    return out


def _answers(done, count: int) -> dict:
    got = {}
    while len(got) < count:
        assert done.poll(120_000), f"{count - len(got)} answers missing"
        answer = done.recv_pyobj()
        assert isinstance(answer, ScoreDone)
        got[answer.rid] = answer
    return got


@pytest.mark.parametrize("overlap", [True, False])
def test_a_burst_over_overlapped_rounds(char_model_dir, tmp_path, overlap):
    context = zmq.Context()
    done = context.socket(zmq.PULL)
    done.bind(f"ipc://{tmp_path}/done")
    work = context.socket(zmq.PUSH)
    work.connect(f"ipc://{tmp_path}/work")
    engine = dict(model_path=str(char_model_dir), dtype="float32", device="cpu")
    proc = multiprocessing.get_context("spawn").Process(
        target=run_scheduler, args=(engine, f"ipc://{tmp_path}/work", f"ipc://{tmp_path}/done",
                                    RoundCapacity(tokens=1000, requests=2)),
        kwargs=dict(overlap=overlap, sleep_on_idle=True), daemon=True)
    proc.start()
    try:
        assert done.poll(120_000), "the scheduler did not start"
        assert isinstance(done.recv_pyobj(), SchedulerReady)
        rng = random.Random(11)
        requests = _steps(rng, agents=3, steps=3)
        order = list(range(len(requests)))
        # An agent's steps in order; the agents interleaved.
        order.sort(key=lambda i: i % 3)
        for rid in order:
            work.send_pyobj(ScoreWork.pack(rid, requests[rid], [LABELS] * 3))
        bad = len(requests)
        too_long = np.arange(1100, dtype=np.int64) % 50 + 3  # more than a round's 1,000 tokens
        work.send_pyobj(ScoreWork.pack(bad, [too_long], [[1, 2]]))
        got = _answers(done, len(requests) + 1)
        assert got[bad].error is not None and got[bad].error_field
        cold = Engine(str(char_model_dir), radix_cache=False)
        for rid, prompts in enumerate(requests):
            answer = got[rid]
            assert answer.error is None, answer.error
            want = cold.run_round([([p.tolist() for p in prompts], [LABELS] * 3)]).answers[0]
            np.testing.assert_allclose(answer.label_logprobs, want, atol=1e-5, rtol=0)
            assert answer.round_requests <= 2
        # Nine requests in rounds of two: later steps found earlier steps' states.
        assert sum(got[rid].cached_tokens > 0 for rid in range(len(requests))) >= 3
        prompt = np.arange(3, 40, dtype=np.int64)
        work.send_pyobj(ScoreWork.pack(99, [prompt], [[1, 2]]))
        again = _answers(done, 1)[99]
        assert again.error is None and len(again.label_logprobs[0]) == 2
    finally:
        proc.kill()
        proc.join(10)
        context.destroy(linger=0)
