"""A round in two halves: launched (planned, its forward and readout queued on
the device) and completed (its answers read back, its rows and slots returned).

Between the two the host is free while the GPU computes: the scheduler plans
and launches the next round there (SGLang's overlap schedule), so the GPU goes
from one round to the next without waiting for the host's plan, tables and
launches. Two launched rounds never conflict:

* the later one's kernels run after the earlier one's on the same stream, so
  it reads the checkpoints the earlier one keeps (inserted at its launch) only
  once they are written, and overwrites shared buffers (a graph's readout rows)
  only after the earlier readout has read them;
* each holds its own K/V rows and state slots until its completion, and the
  cache nodes it resumes from stay locked until then, so no eviction frees them;
  a launch short of rows or slots for want of those the rounds in flight hold
  first completes them (``settle``), as one-at-a-time rounds would have, rather
  than run without the cache or grow the pools;
* pinned host buffers reused from round to round are rewritten only after the
  copy out of them has run (:class:`~.round_buffers.RoundBuffers`).

A question's bits do not change: the same kernels run on the same inputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from ..models.base import ForwardCancelled
from .checkpoints import CacheRound, keep_checkpoints, plan_cached_round
from .model_runner import ModelRunner, Readout, collect
from .round_result import RoundCancelled, RoundResult, RoundStats, round_result
from .rounds import check_per_request
from .state_cache import StateCache


@dataclass
class LaunchedRound:
    """A round whose forward and readout are queued on the device
    (:func:`launch_round`); :func:`complete_round` finishes it.

    Attributes:
        n: requests in the round.
        done: its result once completed (at launch for a round with nothing to
            compute), else None.
        error: what its completion raised, raised again by a later completion.
    """

    n: int
    done: Optional[RoundResult] = None
    error: Optional[BaseException] = None
    requests: list = field(default_factory=list)
    prompts: list = field(default_factory=list)
    plan: object = None
    cache: Optional[StateCache] = None
    cached: CacheRound = field(default_factory=CacheRound)
    stream_rows: Optional[np.ndarray] = None
    slots: list = field(default_factory=list)
    kept: Optional[np.ndarray] = None
    kept_segments: set = field(default_factory=set)
    kept_tokens: dict = field(default_factory=dict)
    readout: Optional[Readout] = None
    graph: object = None
    marks: tuple = (0.0, None)
    seconds: list = field(default_factory=lambda: [0.0, 0.0, 0.0])  # plan, forward, finish so far


def launch_round(runner: ModelRunner, cache: Optional[StateCache], groups: Sequence[tuple],
                 cancelled: Optional[Callable[[], bool]] = None,
                 over_labels: Optional[Sequence[bool]] = None,
                 settle: Optional[Callable[[], bool]] = None) -> LaunchedRound:
    """Plan a round over the state cache, queue its forward and readout on the
    device and keep its requests' checkpoints, without waiting for the GPU.
    Arguments as :meth:`~.engine.Engine.run_round`'s, and ``settle``: completes
    the rounds in flight and says whether there were any, called when the K/V
    pool or the state pool is short of what the round needs (None: never).

    Raises:
        RoundCancelled: ``cancelled()`` was true (rows and slots are free again).
        ValueError: ``over_labels`` of another length, a label id outside the
            vocabulary (rows and slots are free again).
    """
    started = time.perf_counter()
    check_per_request(over_labels, len(groups))
    requests, prompts, labels, normalised = [], [], [], []
    for r, (group_prompts, group_labels, *_) in enumerate(groups):
        requests += [r] * len(group_prompts)
        prompts += list(group_prompts)
        labels += [list(l) for l in group_labels]
        normalised += [bool(over_labels is not None and over_labels[r])] * len(group_prompts)
    n = len(groups)
    if not prompts:
        return LaunchedRound(n, done=RoundResult([[] for _ in groups], [0] * n, [0] * n, [0] * n,
                                                 RoundStats(requests=n), [None]))
    cache, cached, plan, own = plan_cached_round(cache, groups, runner.kv_pool, runner.plan_device, settle)
    launched = LaunchedRound(n, requests=requests, prompts=prompts, plan=plan, cache=cache, cached=cached)
    try:
        rows = [row for row, mine in zip(plan.prompt_readout.tolist(), own) if mine]
        if cache is not None:
            launched.stream_rows = runner.kv_pool.allocate(plan.num_tokens)
            plan.assign_kv_rows(cached.prefix_rows, launched.stream_rows, runner.kv_pool.scratch_row)
        launched.slots = runner.assign_slots(plan, settle)
        planned = time.perf_counter()
        try:
            out, launched.graph = runner.forward(plan, cancelled)  # [>= R, hidden] on the device
        except ForwardCancelled as cut:
            # Its half-written rows and slots go back below; on a GPU the
            # kernels already launched still write them, before any later
            # round's kernels on the same stream.
            raise RoundCancelled(n, len(prompts), plan.num_tokens, cut.layers_run, cut.layers,
                                 time.perf_counter() - started) from None
        launched.marks = runner.forward_marks()
        launched.readout = runner.readout(out, rows, labels, normalised)
        forwarded = time.perf_counter()
        if cache is not None:  # while the GPU computes them
            cache.hits += len(cached.matches)  # here, not before: a cut round is no hit
            cache.cached_tokens_total += int(cached.prefix_rows.size)
            launched.kept, launched.kept_segments, launched.kept_tokens = keep_checkpoints(
                cache, plan, cached, launched.stream_rows, launched.slots)
    except BaseException:
        _release(runner, launched)
        raise
    launched.seconds = [planned - started, forwarded - planned, time.perf_counter() - forwarded]
    return launched


def complete_round(runner: ModelRunner, launched: LaunchedRound) -> RoundResult:
    """Wait for a launched round's answers, return its rows and slots (those its
    checkpoints keep stay taken), unlock what it resumed from and evict the
    cache back within its budget.

    A round completes once: a later call returns the same result (or raises
    the same error) and returns nothing to the pools again.

    Returns:
        The round's :class:`~.round_result.RoundResult`.
    """
    if launched.done is not None:
        return launched.done
    if launched.error is not None:
        raise launched.error
    waiting = time.perf_counter()
    try:
        label_logprobs = collect(launched.readout)
    except BaseException as e:
        launched.error = e
        raise
    finally:
        collected = time.perf_counter()
        _release(runner, launched)
    plan_s, forward_s, finish_s = launched.seconds
    seconds = (plan_s, forward_s + collected - waiting, finish_s + time.perf_counter() - collected,
               launched.marks[0], span_ms(launched.marks[1]) / 1e3)
    cached = launched.cached
    launched.done = round_result(launched.n, launched.requests, label_logprobs, launched.prompts, launched.plan,
                                 [cached.resume[r].length if r in cached.resume else 0 for r in range(launched.n)],
                                 [launched.kept_tokens.get(r, 0) for r in range(launched.n)], launched.graph, seconds)
    return launched.done


def _release(runner: ModelRunner, launched: LaunchedRound) -> None:
    # The round's rows and slots back to their pools (but those its checkpoints
    # took), what it resumed from unlocked, the cache back within its budget.
    rows, kept = launched.stream_rows, launched.kept
    if rows is not None:
        runner.kv_pool.release(rows if kept is None else rows[~kept])
    runner.release_slot([slot for s, slot in enumerate(launched.slots)
                         if slot >= 0 and s not in launched.kept_segments])
    if launched.cache is not None:
        launched.cache.unlock(launched.cached.nodes)
        launched.cache.evict()


def span_ms(events) -> float:
    """Milliseconds between a pair of recorded CUDA events (a forward's start and
    end on the GPU's stream: a replay's kernels, or an eager forward's with its
    launch gaps); waits for the second. 0.0 for None."""
    if events is None:
        return 0.0
    events[1].synchronize()
    return events[0].elapsed_time(events[1])
