"""An idle scheduler polls its socket without pause (SGLang's default; Flide's
on CUDA devices) or blocks on it (``--sleep-on-idle``; Flide's default on the
CPU), and answers requests either way (flide_ext/server/scheduler.py)."""

from __future__ import annotations

import multiprocessing
import time

import numpy as np
import psutil
import pytest
import zmq

from flide_ext.server.io_struct import SchedulerReady, ScoreDone, ScoreWork
from flide_ext.server.scheduler import run_scheduler

IDLE_S = 1.5  # seconds of idleness over which the scheduler's CPU time is read


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


@pytest.mark.parametrize("sleep_on_idle", [False, True])
def test_an_idle_scheduler_polls_or_blocks_and_answers(char_model_dir, tmp_path, sleep_on_idle):
    context = zmq.Context()
    done = context.socket(zmq.PULL)
    done.bind(f"ipc://{tmp_path}/done")
    work = context.socket(zmq.PUSH)
    work.connect(f"ipc://{tmp_path}/work")
    engine = dict(model_path=str(char_model_dir), dtype="float32", device="cpu")
    proc = multiprocessing.get_context("spawn").Process(
        target=run_scheduler, args=(engine, f"ipc://{tmp_path}/work", f"ipc://{tmp_path}/done"),
        kwargs=dict(sleep_on_idle=sleep_on_idle), daemon=True)
    proc.start()
    try:
        assert done.poll(120_000), "the scheduler did not start"
        assert isinstance(done.recv_pyobj(), SchedulerReady)
        scheduler = psutil.Process(proc.pid)
        time.sleep(0.5)  # past the ready message's aftermath
        before = _cpu(scheduler)
        time.sleep(IDLE_S)
        spent = _cpu(scheduler) - before
        if sleep_on_idle:
            assert spent < 0.2 * IDLE_S, f"a blocked scheduler spent {spent:.2f} s of CPU in {IDLE_S} s idle"
        else:
            assert spent > 0.4 * IDLE_S, f"a polling scheduler spent only {spent:.2f} s of CPU in {IDLE_S} s idle"
        prompt = np.arange(3, 40, dtype=np.int64)
        work.send_pyobj(ScoreWork.pack(7, [prompt], [[1, 2]]))
        assert done.poll(60_000), "no answer"
        answer = done.recv_pyobj()
        assert isinstance(answer, ScoreDone) and answer.rid == 7 and answer.error is None
        assert len(answer.label_logprobs) == 1 and len(answer.label_logprobs[0]) == 2
    finally:
        proc.kill()
        proc.join(10)
        context.destroy(linger=0)
