"""The scheduler process: owns the Engine, packs waiting requests into rounds.

When a round starts, every waiting request that still fits the round's token,
segment and request capacity joins it, in arrival order (the engine's own
:class:`flide_ext.runtime.rounds.RoundQueue`), so no request waits behind a
round that could have held it; the rest wait for the next round, with whatever
arrived meanwhile. Each request counts what it would compute then: its prefix
tree less the state it resumes from the cache (``Engine.round_size``), so agents
whose long histories are cached step together; it is measured when it arrives
and again whenever the cache changes (after a round or a flush). Each round is
one flat stream; every request resumes from the engine's state cache and
leaves its state there. A round is launched (``Engine.launch_round``: planned,
its forward and readout queued on the device) before the round in flight is
completed (``Engine.complete_round``: its answers read back and sent), so the
host's plan, tables and launches of one round run while the GPU computes the
one before (SGLang's overlap schedule; ``--disable-overlap-schedule`` runs them
one at a time). With nothing waiting, the round in flight is completed at once.

A round may also be held to a time budget (``--round-seconds``,
:class:`~flide_ext.runtime.rounds.RoundPace`): it takes the first waiting
request and then only as many stream tokens as past rounds' seconds per token
say fit the budget, so a burst is answered in several short rounds, the first
ones early, instead of one long round that holds every client.

A FlushCache empties the cache between two rounds (requests already waiting run
after it, recomputing their states) and is answered at once; every answer
carries the cache's stats after it, for ``/metrics``. An Abort withdraws a
waiting request (its client went away or it timed out), which then never runs.
A running round whose requests are all withdrawn stops after the layer it is
in (:mod:`.withdrawals`), answers nobody and keeps nothing in the cache; one
that still has a request awaited runs to its end (one flat stream computes
them all).

The process heartbeats from a thread of its own and dies with its parent
(:mod:`.liveness`); it ignores SIGINT (a terminal's Ctrl-C reaches the whole
process group): the server stops it.
"""

from __future__ import annotations

import gc
import logging
import signal
import time
import traceback
from typing import Optional

import zmq

from ..protocol.errors import RequestError
from ..runtime.capacity import RoundCapacity
from ..runtime.round_result import RoundCancelled
from ..runtime.rounds import RoundPace, RoundQueue, request_size
from .cache_args import device_fraction_budget
from .io_struct import Abort, FlushCache, FlushCacheDone, RoundCut, SchedulerReady, ScoreDone, ScoreWork
from .liveness import RoundClock, die_with_parent, start_heartbeat
from .round_log import RoundStatsLog, configure_logging, log_cut, log_round
from .withdrawals import Withdrawals, start_abort_reader

logger = logging.getLogger(__name__)


def run_scheduler(engine_kwargs: dict, work_addr: str, done_addr: str, capacity: RoundCapacity = RoundCapacity(),
                  mem_fraction_static: Optional[float] = None, log_level: Optional[str] = None,
                  heartbeat_addr: Optional[str] = None, heartbeat_interval: float = 1.0,
                  round_seconds: Optional[float] = None, abort_addr: Optional[str] = None,
                  warmup: Optional[bool] = None, log_interval: int = 40,
                  sleep_on_idle: Optional[bool] = None, overlap: Optional[bool] = None) -> None:
    """Process entry point: load the model, then serve rounds forever.

    Args:
        engine_kwargs: keyword arguments of :class:`flide_ext.Engine`.
        work_addr: ZMQ address the tokenizer manager pushes ScoreWork to (bound here).
        done_addr: ZMQ address ScoreDone results are pushed to (bound by the manager).
        capacity: most stream tokens, segments and requests per round. A
            request that cannot fit one, even resuming from the cache, is
            answered with the error (HTTP 400 naming its field), not run.
        mem_fraction_static: size the state cache from this fraction of the GPU's
            memory (:func:`~.cache_args.fraction_budget`), here, where the GPU is.
        log_level: the level of Flide's loggers in this process (the server's
            ``--log-level``; None leaves them as they are); at ``info`` the
            rounds' stats every ``log_interval`` rounds
            (:class:`~.round_log.RoundStatsLog`), at ``debug`` each round too.
        heartbeat_addr: ZMQ address heartbeats are pushed to (bound by the
            server; None: none are sent), once the model is loaded.
        heartbeat_interval: seconds between heartbeats.
        round_seconds: a round's time budget in seconds (None: the capacity alone).
        abort_addr: ZMQ address the manager pushes each Abort to as well (bound
            here), read while rounds run (None: a running round is never cut).
        warmup: run the warm-up rounds (:func:`~flide_ext.runtime.warmup.warm_up`)
            before answering anything; None: on a CUDA device only (on the CPU
            no kernel compiles on first use).
        log_interval: rounds per stats line (SGLang's ``--decode-log-interval``).
        sleep_on_idle: with no request waiting, block on the socket (True) or
            poll it without pause (False: a request is taken the moment it
            comes, without a wake-up, as SGLang's scheduler polls unless
            ``--sleep-on-idle``); None: poll on a CUDA device, block on the CPU
            (where a polling process would take a core from the rounds).
        overlap: launch the next round before completing the one in flight
            (SGLang's overlap schedule; False is its ``--disable-overlap-schedule``):
            the host plans and launches it while the GPU computes
            (:mod:`~flide_ext.runtime.launched_round`); None: on a CUDA device
            only (on the CPU a launch computes the whole forward, so the round
            in flight would only answer later).
    """
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    context = zmq.Context()
    work = context.socket(zmq.PULL)
    work.setsockopt(zmq.RCVHWM, 0)  # the manager's requests are never held back in its process
    work.bind(work_addr)
    done = context.socket(zmq.PUSH)
    done.connect(done_addr)
    withdrawals = Withdrawals()
    if abort_addr is not None:
        start_abort_reader(context, abort_addr, withdrawals)
    try:
        if log_level is not None:
            configure_logging(log_level)
        from ..runtime.engine import Engine
        from ..runtime.memory import memory_bytes
        from ..runtime.warmup import warm_up

        if mem_fraction_static is not None:
            budget = device_fraction_budget(mem_fraction_static, engine_kwargs["device"], engine_kwargs["model_path"])
            if budget is not None:
                engine_kwargs = {**engine_kwargs, "state_cache_bytes": budget}
        loading = time.perf_counter()
        engine = Engine(**engine_kwargs, round_capacity=capacity)
        loaded = time.perf_counter() - loading
        if warmup or (warmup is None and engine.device.type == "cuda"):
            warmed = warm_up(engine)
        else:
            warmed = None
    except Exception as e:  # report any start failure to the parent, then stop
        done.send_pyobj(RuntimeError(f"{type(e).__name__}: {e}"))
        return
    clock = RoundClock()
    if heartbeat_addr is not None:
        start_heartbeat(context, heartbeat_addr, heartbeat_interval, clock)
    stream = engine.runner.model.stream_dtype(engine.dtype)
    graphs = engine.graphs
    info = {"path": str(engine.path), "cache": engine.cache_stats(),
            "residual_dtype": str(stream).removeprefix("torch."), "memory": memory_bytes(engine.runner),
            "graphs": {"count": graphs.captures if graphs is not None else 0,
                       "seconds": graphs.capture_seconds if graphs is not None else 0.0},
            "load_seconds": loaded - (graphs.capture_seconds if graphs is not None else 0.0),
            "warmup": vars(warmed) if warmed is not None else None}
    # As SGLang's processes do after warmup (sglang.srt.utils.freeze_gc): the
    # model's and the graphs' objects leave the collector's generations, so a
    # full collection, whose pause holds up a round (an eager one's launches
    # with it), scans only what was made since; the state cache makes that grow.
    gc.collect()
    gc.freeze()
    done.send_pyobj(SchedulerReady(engine.vocab_size, engine.context_length, info))
    waiting: RoundQueue[ScoreWork] = RoundQueue(capacity)
    pace = RoundPace(round_seconds) if round_seconds is not None else None
    stats_log = RoundStatsLog(log_interval)

    def measure(w: ScoreWork):
        # What it computes if its round ran now: its tree less what it resumes.
        return engine.round_size(w.state, w.size or request_size(w.prompts, w.field))

    def remeasure() -> None:
        # The cache changed: what a waiting request resumes may have too.
        if engine.cache is not None:
            for w, e in waiting.resize(measure):
                done.send_pyobj(ScoreDone(w.rid, error=e.message, error_field=e.field))

    spin = not sleep_on_idle if sleep_on_idle is not None else engine.device.type == "cuda"
    overlap = overlap if overlap is not None else engine.device.type == "cuda"
    flight: Optional[_Flight] = None  # the round launched last, not yet completed
    last_done = time.perf_counter()

    def complete() -> None:
        # Wait for the round in flight, send its answers, log it.
        nonlocal flight, last_done
        f, flight = flight, None
        try:
            with clock.running():
                result = engine.complete_round(f.launched)
        except Exception:
            _failed(f.batch, done)
            return
        now = time.perf_counter()
        if pace is not None:  # the time it had the GPU to itself, not its wait behind the round before
            pace.observe(result.stats.stream_tokens, now - max(f.started, last_done))
        last_done = now
        _answer(f, result, engine.cache_stats(), done)
        seconds = time.perf_counter() - f.started
        log_round(result, seconds - result.stats.plan_seconds - result.stats.forward_seconds, len(waiting))
        stats_log.add(result, seconds, len(waiting))

    while True:
        if not len(waiting) and flight is None:
            # The parent watch (liveness) ends this process if the server goes.
            if spin:
                while not work.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # no poller made per look
                    pass
            else:
                work.poll()
        withdrawn = set()
        while True:
            try:
                w = work.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                break
            if isinstance(w, Abort):  # after its ScoreWork: one socket keeps their order
                withdrawn.add(w.rid)
                continue
            if isinstance(w, FlushCache):  # between two rounds: none is running
                if flight is not None:
                    complete()
                with clock.running():  # the watchdog's too
                    flushed = _flush(engine, w)
                done.send_pyobj(flushed)
                remeasure()
                continue
            try:
                waiting.put(w, measure(w), w.field)
            except RequestError as e:
                done.send_pyobj(ScoreDone(w.rid, error=e.message, error_field=e.field))
        if withdrawn:
            gone = waiting.remove(lambda w: w.rid in withdrawn)
            logger.debug("withdrew %d of %d abandoned requests before their round", len(gone), len(withdrawn))
        batch = waiting.next_round(pace.budget() if pace is not None else None)
        # The next round is launched before the one in flight is completed: its
        # plan, tables and launches run while the GPU computes the one before.
        launched = _launch(engine, batch, withdrawals, clock, done, len(waiting)) if batch else None
        changed = bool(batch) or flight is not None
        if flight is not None:
            complete()
        flight = launched
        if flight is not None and not overlap:
            complete()
        if changed:  # a round launched (its checkpoints are in the cache) or completed (evicted)
            remeasure()


class _Flight:
    """A launched round's requests and start."""

    def __init__(self, batch: list, launched, started: float, started_at: float):
        self.batch, self.launched, self.started, self.started_at = batch, launched, started, started_at


def _launch(engine, batch: list, withdrawals: Withdrawals, clock: RoundClock, done,
            waiting: int) -> Optional[_Flight]:
    # Launch a round of ``batch``; a round cut or failed before its forward is
    # queued is answered here (None).
    started, started_at = time.perf_counter(), time.time()
    withdrawals.start_round(w.rid for w in batch)
    try:
        with clock.running():
            launched = engine.launch_round([(w.prompts, w.labels, w.state) for w in batch], withdrawals.all_gone,
                                           over_labels=[w.over_labels for w in batch])
    except RoundCancelled as cut:
        done.send_pyobj(RoundCut([w.rid for w in batch], engine.cache_stats()))
        log_cut(cut, waiting)
        return None
    except Exception:
        _failed(batch, done)
        return None
    return _Flight(batch, launched, started, started_at)


def _answer(flight: _Flight, result, cache: dict, done) -> None:
    # Each request's answer, with its stages: queued since the manager sent it
    # (its socket's wait included; one machine's wall clock across the two
    # processes), then the round's plan, forward and finish.
    rs = result.stats
    finish = time.perf_counter() - flight.started - rs.plan_seconds - rs.forward_seconds
    for w, logprobs, stream, cached in zip(flight.batch, result.answers, result.stream_tokens,
                                           result.resumed_tokens):
        stages = {"queue": max(0.0, flight.started_at - w.sent), "plan": rs.plan_seconds,
                  "forward": rs.forward_seconds, "finish": finish}
        # cached_tokens as prompt_tokens, summed over the request's prompts:
        # each one's first ``cached`` tokens came from the cache.
        done.send_pyobj(ScoreDone(w.rid, logprobs, stream, len(flight.batch), cached * len(w.prompts), cache=cache,
                                  stages=stages))


def _failed(batch: list, done) -> None:
    message = traceback.format_exc(limit=3)
    logger.error("round of %d requests failed: %s rid=%s", len(batch), message, ",".join(w.request_id for w in batch))
    for w in batch:
        done.send_pyobj(ScoreDone(w.rid, error="the round failed inside the engine"))


def _flush(engine, work: FlushCache) -> FlushCacheDone:
    try:
        engine.flush_cache()
        return FlushCacheDone(work.rid, cache=engine.cache_stats())
    except Exception as e:  # reported to the client, not raised: the loop goes on
        logger.error("flush_cache failed: %s", traceback.format_exc(limit=3))
        return FlushCacheDone(work.rid, error=f"{type(e).__name__}: {e}")
