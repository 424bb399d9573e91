"""The scheduler process: owns the Engine, packs waiting requests into rounds.

When a round starts, every waiting request that still fits the round's token,
segment and request capacity joins it, in arrival order (the engine's own
:class:`flide_ext.runtime.rounds.RoundQueue`), so no request waits behind a
round that could have held it; the rest wait for the next round, with whatever
arrived meanwhile. Each round is one flat stream (``Engine.run_round``).
"""

from __future__ import annotations

import logging
import os
import traceback

import zmq

from ..protocol.errors import RequestError
from ..runtime.capacity import RoundCapacity
from ..runtime.rounds import RoundQueue, request_size
from .io_struct import SchedulerReady, ScoreDone, ScoreWork

logger = logging.getLogger(__name__)


def run_scheduler(engine_kwargs: dict, work_addr: str, done_addr: str, capacity: RoundCapacity = RoundCapacity()) -> None:
    """Process entry point: load the model, then serve rounds forever.

    Args:
        engine_kwargs: keyword arguments of :class:`flide_ext.Engine`.
        work_addr: ZMQ address the tokenizer manager pushes ScoreWork to (bound here).
        done_addr: ZMQ address ScoreDone results are pushed to (bound by the manager).
        capacity: most stream tokens, segments and requests per round. The
            tokenizer manager refuses requests larger than a round (HTTP 400);
            one that arrives anyway is answered with an error, not run.
    """
    context = zmq.Context()
    work = context.socket(zmq.PULL)
    work.bind(work_addr)
    done = context.socket(zmq.PUSH)
    done.connect(done_addr)
    try:
        from ..runtime.engine import Engine

        engine = Engine(**engine_kwargs, round_capacity=capacity)
    except Exception as e:  # report any start failure to the parent, then stop
        done.send_pyobj(RuntimeError(f"{type(e).__name__}: {e}"))
        return
    done.send_pyobj(SchedulerReady(engine.vocab_size, engine.context_length, {"path": str(engine.path)}))
    parent = os.getppid()
    waiting: RoundQueue[ScoreWork] = RoundQueue(capacity)
    while True:
        # Wake up now and then to notice a parent that died without stopping us.
        while not len(waiting) and not work.poll(1000):
            if os.getppid() != parent:
                return
        while True:
            try:
                w = work.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                waiting.put(w, request_size(w.prompts))
            except RequestError as e:
                done.send_pyobj(ScoreDone(w.rid, error=str(e)))
        batch = waiting.next_round()
        if not batch:
            continue
        try:
            result = engine.run_round([(w.prompts, w.labels) for w in batch], [w.keep_state for w in batch])
            for w, logprobs, stream in zip(batch, result.answers, result.stream_tokens):
                done.send_pyobj(ScoreDone(w.rid, logprobs, stream, len(batch)))
        except Exception:
            message = traceback.format_exc(limit=3)
            logger.error("round failed: %s", message)
            for w in batch:
                done.send_pyobj(ScoreDone(w.rid, error="the round failed inside the engine"))
