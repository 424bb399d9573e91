"""Execution strategies of the engine, for ablation and comparison.

* ``flide``: each request's prompts as one prefix tree, the state computed once
  and forked to every question inside one flat stream (:meth:`Engine.run_rounds`,
  with the engine's state cache as it stands).
* ``no_fork``: one sequence per question, the state recomputed for each (the
  state cache is off for the call).
* ``prefix_cache``: the strategy of today's serving engines: the state computed
  once and cached, then each question run as its own sequence continuing from
  the cache. The engine's own state cache does the caching; it resumes at
  checkpoints, multiples of 64 tokens (:data:`~.state_cache.ALIGN`), so each
  question recomputes the rest of its state. The cache is emptied before and
  after the call.

Every strategy packs its sequences into rounds within the engine's round
capacity, as the scheduler does, and returns a
:class:`~.round_result.RoundResult` as :meth:`Engine.run_rounds` does; on the
CPU reference the same bits: a question's answer does not depend on how it ran.
Its ``stats.stream_tokens`` count every token the strategy computed (for
``prefix_cache``, the cached states too).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..plan.tree import build_prefix_tree
from .state_cache import ALIGN

STRATEGIES = ("flide", "no_fork", "prefix_cache")


def _shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    tree = build_prefix_tree([0] * len(prompts), prompts)
    roots = [seg for seg in tree.segments if seg.parent < 0]
    return len(roots[0].tokens) if len(roots) == 1 else 0


def cached_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens of a request's state the prefix cache resumes from: the shared
    prefix, leaving every question at least one token of its own, cut down to a
    checkpoint position (a multiple of :data:`~.state_cache.ALIGN`)."""
    n = max(min(_shared_prefix(prompts), min(len(p) for p in prompts) - 1), 0)
    return n - n % ALIGN


def run_strategy(engine, groups, strategy: str = "flide"):
    """Answer ``groups`` (as :meth:`Engine.run_round`) with ``strategy``.

    Args:
        engine: a :class:`~flide_ext.runtime.engine.Engine`.
        groups: per request ``(prompts, label ids per prompt)``.
        strategy: one of :data:`STRATEGIES`.

    Returns:
        A :class:`~.round_result.RoundResult`: per request, per prompt, the
        labels' log-probabilities; stats of everything computed.

    Raises:
        ValueError: an unknown strategy, or ``prefix_cache`` on an engine whose
            state cache is off.

    Not for use while other threads call the same engine (``no_fork`` turns
    its cache off for the call, ``prefix_cache`` empties it).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy == "flide":
        return engine.run_rounds(groups)
    singles = [([p], [l]) for prompts, labels in groups for p, l in zip(prompts, labels)]
    state_tokens = 0
    cache = engine.cache
    if strategy == "no_fork":
        engine.cache = None
        try:
            flat = engine.run_rounds(singles)
        finally:
            engine.cache = cache
    else:
        if cache is None:
            raise ValueError("prefix_cache runs on the engine's state cache, which is off (radix_cache=False)")
        # The first pass computes each state; one token more than the cached
        # length puts its checkpoint at that length. Its readout is not used.
        states = [list(prompts[0][:cached_length(prompts) + 1]) for prompts, _ in groups
                  if prompts and cached_length(prompts) > 0]
        engine.flush_cache()
        try:
            if states:
                state_tokens = engine.run_rounds([([state], [[0]]) for state in states]).stats.stream_tokens
            flat = engine.run_rounds(singles)
        finally:
            engine.flush_cache()
    # Regroup the single-question answers by request; the stats count what the
    # strategy computed: the cached states too.
    answers, stream, resumed, at = [], [], [], 0
    for prompts, _ in groups:
        mine = range(at, at + len(prompts))
        answers.append([flat.answers[i][0] for i in mine])
        stream.append(sum(flat.stream_tokens[i] for i in mine))
        resumed.append(sum(flat.resumed_tokens[i] for i in mine))
        at += len(prompts)
    return replace(flat, answers=answers, stream_tokens=stream, resumed_tokens=resumed, kept_tokens=[0] * len(groups),
                   stats=replace(flat.stats, stream_tokens=flat.stats.stream_tokens + state_tokens))
