"""The scheduler process: owns the Engine, packs waiting requests into rounds.

Every request that is waiting when a round starts joins it (up to
``max_round_requests``), so no request waits behind a round that could have
held it. Each round is one flat stream (``Engine.run_round``).
"""

from __future__ import annotations

import logging
import os
import traceback

import zmq

from .io_struct import SchedulerReady, ScoreDone, ScoreWork

logger = logging.getLogger(__name__)


def run_scheduler(engine_kwargs: dict, work_addr: str, done_addr: str, max_round_requests: int = 256) -> None:
    """Process entry point: load the model, then serve rounds forever.

    Args:
        engine_kwargs: keyword arguments of :class:`flide_ext.Engine`.
        work_addr: ZMQ address the tokenizer manager pushes ScoreWork to (bound here).
        done_addr: ZMQ address ScoreDone results are pushed to (bound by the manager).
        max_round_requests: most requests in one round.
    """
    context = zmq.Context()
    work = context.socket(zmq.PULL)
    work.bind(work_addr)
    done = context.socket(zmq.PUSH)
    done.connect(done_addr)
    try:
        from ..runtime.engine import Engine

        engine = Engine(**engine_kwargs)
    except Exception as e:  # report any start failure to the parent, then stop
        done.send_pyobj(RuntimeError(f"{type(e).__name__}: {e}"))
        return
    done.send_pyobj(SchedulerReady(engine.vocab_size, engine.context_length, {"path": str(engine.path)}))
    parent = os.getppid()
    while True:
        # Wake up now and then to notice a parent that died without stopping us.
        while not work.poll(1000):
            if os.getppid() != parent:
                return
        batch = [work.recv_pyobj()]
        while len(batch) < max_round_requests:
            try:
                batch.append(work.recv_pyobj(zmq.NOBLOCK))
            except zmq.Again:
                break
        try:
            results = engine.run_round([(w.prompts, w.labels) for w in batch], [w.keep_state for w in batch])
            stream = engine.last_request_stream_tokens
            for i, (w, logprobs) in enumerate(zip(batch, results)):
                done.send_pyobj(ScoreDone(w.rid, logprobs, stream[i], len(batch)))
        except Exception:
            message = traceback.format_exc(limit=3)
            logger.error("round failed: %s", message)
            for w in batch:
                done.send_pyobj(ScoreDone(w.rid, error="the round failed inside the engine"))
