"""Execution strategies of the engine, for ablation and comparison.

* ``flide``: each request's prompts as one prefix tree, the state computed once
  and forked to every question inside one flat stream (:meth:`Engine.run_rounds`).

Every strategy packs its sequences into rounds within the engine's round
capacity, as the scheduler does.
* ``no_fork``: one sequence per question, the state recomputed for each.
* ``prefix_cache``: the strategy of today's serving engines: the state computed
  once and cached, then each question run as its own sequence continuing from
  the cache. A recurrent (GDN) state can only be resumed where it was saved, and
  such caches save it on a grid (``grid`` tokens, 64 by default), so on hybrid
  models the cache holds the state up to the last grid point and each question
  recomputes the rest.

Every strategy returns a :class:`~.round_result.RoundResult` as
:meth:`Engine.run_rounds` does, and on the CPU reference the same bits: a
question's answer does not depend on how it ran. Its ``stats.stream_tokens``
count every token the strategy computed (for ``prefix_cache``, the cached
states too).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..plan.tree import build_prefix_tree
from .checkpoints import CheckpointStore

STRATEGIES = ("flide", "no_fork", "prefix_cache")


def _shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    tree = build_prefix_tree([0] * len(prompts), prompts)
    roots = [seg for seg in tree.segments if seg.parent < 0]
    return len(roots[0].tokens) if len(roots) == 1 else 0


def cached_length(prompts: Sequence[Sequence[int]], recurrent: bool, grid: int = 64) -> int:
    """Tokens of a request's state a prefix cache resumes from: the shared prefix,
    leaving every question at least one token of its own, cut down to a multiple
    of ``grid`` when the model has recurrent layers."""
    n = min(_shared_prefix(prompts), min(len(p) for p in prompts) - 1)
    return n - n % grid if recurrent else max(n, 0)


def run_strategy(engine, groups, strategy: str = "flide", grid: int = 64):
    """Answer ``groups`` (as :meth:`Engine.run_round`) with ``strategy``.

    Args:
        engine: a :class:`~flide_ext.runtime.engine.Engine`.
        groups: per request ``(prompts, label ids per prompt)``.
        strategy: one of :data:`STRATEGIES`.
        grid: the recurrent-state save grid of ``prefix_cache`` (tokens).

    Returns:
        A :class:`~.round_result.RoundResult`: per request, per prompt, the
        labels' log-probabilities; stats of everything computed.

    Raises:
        ValueError: an unknown strategy, or a grid that is not a positive integer.

    Not for use while other threads call the same engine: ``prefix_cache``
    swaps in its own checkpoint store for the call.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if type(grid) is not int or grid < 1:
        raise ValueError(f"grid must be a positive integer, not {grid!r}")
    if strategy == "flide":
        return engine.run_rounds(groups)
    singles = [([p], [l]) for prompts, labels in groups for p, l in zip(prompts, labels)]
    cached = []
    if strategy == "prefix_cache":
        recurrent = engine.model.num_gdn_layers > 0
        for prompts, _ in groups:
            n = cached_length(prompts, recurrent, grid) if prompts else 0
            if n > 0:
                cached.append(list(prompts[0][:n]))
    # The strategy's cache is its own store, sized for every state it keeps: the
    # engine's checkpoints (a user's) are neither evicted nor used meanwhile.
    own = CheckpointStore(max(1, len(cached)), engine.checkpoints.release_slot, max(1, sum(map(len, cached))))
    saved, engine.checkpoints = engine.checkpoints, own
    try:
        state_tokens = 0
        if cached:
            # Computing the states is the cache's first pass; their readout is not used.
            state_tokens = engine.run_rounds([([state], [[0]]) for state in cached], [True] * len(cached)).stats.stream_tokens
        flat = engine.run_rounds(singles)
    finally:
        own.clear()
        engine.checkpoints = saved
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
