"""How a round uses the state cache: the checkpoints its requests resume from,
the tiers their states are cut into, and the checkpoints they leave behind.

A request's *state* is the prefix all its prompts share, less the last token
(every question keeps at least one token of its own). It resumes from the
longest checkpoint of it in the :class:`~.state_cache.StateCache` and computes
the rest in one pass, cut into tiers at checkpoint positions: the last multiple
of :data:`~.state_cache.ALIGN` tokens in the state (whose state becomes the
request's checkpoint) and, for GDN models, the last one shared with a state
already cached (so two clients with one system prompt come to share its
checkpoint). The cuts are extra segment ends of the request's prefix tree; at a
checkpoint position they change no bit of what follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..plan.flat import Resume, plan_round
from ..plan.tree import MAX_TREE_DEPTH, common_prefix
from .capacity import RequestSize
from .state_cache import ALIGN, Match, StateCache


@dataclass
class CacheRound:
    """One round's use of the cache.

    Attributes:
        matches: request index -> its :class:`~.state_cache.Match` (resuming ones).
        resume: request index -> the plan's :class:`~flide_ext.plan.flat.Resume`.
        prefix_rows: ``[P]`` int64 pool rows of the key prefix (resumed requests
            in index order).
        cuts: request index -> checkpoint positions its state is cut at, ascending.
        states: request index -> its state's token ids (int64).
    """

    matches: dict = field(default_factory=dict)
    resume: dict = field(default_factory=dict)
    prefix_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    cuts: dict = field(default_factory=dict)
    states: dict = field(default_factory=dict)

    @property
    def nodes(self) -> list:
        """The deepest node of each resumed prefix: locked while the round runs
        (its ancestors have a child, so they keep their rows)."""
        return [m.nodes[-1] for m in self.matches.values()]


def state_of(prompts) -> np.ndarray:
    """A request's state: ``[n]`` int64, its prompts' common prefix less at least
    the shortest one's last token (every question keeps a token of its own)."""
    arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
    if not arrays:  # a request with no prompts (answered with none) has no state
        return np.zeros(0, np.int64)
    return arrays[0][:max(min(common_prefix(arrays), min(len(a) for a in arrays) - 1), 0)]


def _cuts(cache: StateCache, state: np.ndarray, match: Match) -> list:
    # Where the state is cut: its last checkpoint position beyond what it resumes
    # and, for GDN models, the last one it shares with a cached state before that.
    top = len(state) // ALIGN * ALIGN
    shared = min(match.matched, len(state)) // ALIGN * ALIGN
    cuts = [shared] if cache.recurrent and match.length < shared < top else []
    return cuts + [top] if top > match.length else cuts


def round_size(cache: StateCache, state: np.ndarray, size: RequestSize) -> RequestSize:
    """A request's size in a round run now: its prefix tree's ``size``
    (:func:`~.rounds.request_size`) less the state tokens it would resume from the
    cache, plus a segment per cut of its state. Marks the matched nodes as
    recently used; takes no lock.

    Args:
        cache: the state cache.
        state: ``[n]`` int64 the request's state (:func:`state_of`).
        size: its prefix tree's size without the cache.
    """
    match = cache.match(state, len(state))
    return RequestSize(size.tokens - match.length, size.segments + len(_cuts(cache, state, match)))


def plan_cache(cache: StateCache, groups) -> CacheRound:
    """Match every request of a round against the cache and choose its cuts.

    Args:
        cache: the state cache.
        groups: per request ``(prompts, labels)``, or ``(prompts, labels, state)``
            when the caller knows its :func:`state_of` (not computed again).
    """
    out, offset, parts = CacheRound(), 0, []
    for r, group in enumerate(groups):
        state = group[2] if len(group) > 2 else state_of(group[0])
        out.states[r] = state
        match: Match = cache.match(state, len(state))
        base = match.length
        if base:
            out.matches[r] = match
            out.resume[r] = Resume(base, match.slot, offset)
            parts.append(match.rows)
            offset += base
        cuts = _cuts(cache, state, match)
        if cuts:
            out.cuts[r] = cuts
    if parts:
        out.prefix_rows = np.concatenate(parts)
    return out


def cut_prompts(cached: CacheRound, groups) -> tuple[list, list, list]:
    """The round's prompts for planning: each request's own, then one prompt per
    cut (its state up to the cut), which ends a segment there.

    Returns:
        ``(requests, prompts, own)``: per planned prompt its request, its tokens,
        and whether it is a request's own prompt (cut prompts are read out by
        nobody).
    """
    requests, prompts, own = [], [], []
    for r, group in enumerate(groups):
        for p in group[0]:  # lists or int64 arrays, not copied
            requests.append(r)
            prompts.append(p)
            own.append(True)
        for c in cached.cuts.get(r, ()):
            requests.append(r)
            prompts.append(cached.states[r][:c])
            own.append(False)
    return requests, prompts, own


def too_deep(plan, cached: CacheRound) -> list:
    """Requests whose cuts make their tree deeper than the planner allows."""
    deepest: dict = {}
    for seg in plan.tree.segments:
        deepest[seg.request] = max(deepest.get(seg.request, 0), seg.depth + 1)
    return [r for r in cached.cuts if deepest.get(r, 0) > MAX_TREE_DEPTH]


def plan_with_cuts(groups, cached: CacheRound, device):
    """The round's :class:`~flide_ext.plan.flat.FlatPlan` with its requests' cuts,
    on ``device``; requests whose cuts would make their tree deeper than the
    planner allows keep no new checkpoint (their cuts are dropped from ``cached``).

    Returns:
        ``(plan, own)``: the plan, and per planned prompt whether it is a
        request's own (see :func:`cut_prompts`).
    """
    planned, prompts, own = cut_prompts(cached, groups)
    plan = plan_round(planned, prompts, device, cached.resume)
    deep = too_deep(plan, cached) if cached.cuts else []
    if deep:
        for r in deep:
            del cached.cuts[r]
        planned, prompts, own = cut_prompts(cached, groups)
        plan = plan_round(planned, prompts, device, cached.resume)
    return plan, own


def plan_cached_round(cache: Optional[StateCache], groups, kv_pool, device,
                      settle: Optional[Callable[[], bool]] = None):
    """The round's plan over the state cache: each request resumes from its
    longest checkpoint, whose nodes are locked (the caller unlocks
    ``cached.nodes``), and the cache is evicted until ``kv_pool`` has the
    stream's rows. When the pool is still short and ``settle`` completes rounds
    in flight (their rows come back, their locks go), the cache is evicted
    again. A round larger than the pool's working rows (beyond the round
    capacity, run directly) runs as with the cache off.

    Args:
        cache: the state cache, or None (off).
        groups: per request ``(prompts, labels)``.
        kv_pool: the :class:`~.kv_pool.KVPool` the cache's rows are in.
        device: where the plan is built.
        settle: completes the rounds launched and not yet completed; true when
            there were any (None: there are none).

    Returns:
        ``(cache, cached, plan, own)``: the cache the round uses (None: off or
        bypassed), its :class:`CacheRound`, and :func:`plan_with_cuts`'s plan and own.
    """
    cached = plan_cache(cache, groups) if cache is not None else CacheRound()
    plan, own = plan_with_cuts(groups, cached, device)
    if cache is not None:
        cache.lock(cached.nodes)
        cache.evict(rows_needed=plan.num_tokens)
        if kv_pool.num_free < plan.num_tokens and settle is not None and settle():
            cache.evict(rows_needed=plan.num_tokens)
        if kv_pool.num_free < plan.num_tokens:
            cache.unlock(cached.nodes)
            cache, cached = None, CacheRound()
            plan, own = plan_with_cuts(groups, cached, device)
    return cache, cached, plan, own


def _chains(plan, requests) -> dict:
    # Per request, its segments: (logical start, stream start, length, segment index).
    out = {r: [] for r in requests}
    logical, stream = plan.seg_logical_start.tolist(), plan.seg_start.tolist()
    for s, seg in enumerate(plan.tree.segments):
        chain = out.get(seg.request)
        if chain is not None:
            chain.append((logical[s], stream[s], len(seg.tokens), s))
    return out


def keep_checkpoints(cache: StateCache, plan, cached: CacheRound, stream_rows: np.ndarray,
                     slots: list) -> tuple[np.ndarray, set, dict]:
    """Leave every request's state behind in the cache, at its cuts.

    Args:
        cache: the state cache.
        plan: the round's plan.
        cached: the round's :class:`CacheRound`.
        stream_rows: ``[T]`` the pool rows the stream's K/V were written to.
        slots: per real segment its GDN slot (empty without GDN layers).

    Returns:
        ``(kept, kept_segments, kept_tokens)``: ``[T]`` bool, true at the stream
        rows the cache now owns (the caller frees ``stream_rows[~kept]``), the
        segments whose slots it took, and request index -> tokens of the
        longest checkpoint it left.
    """
    # A mask over the stream, set where the cache takes rows: freeing the rest
    # needs no set lookup (np.isin) of every stream row among the kept ones.
    kept, kept_segments, kept_tokens = np.zeros(len(stream_rows), dtype=bool), set(), {}
    chains = _chains(plan, cached.cuts)
    for r, cuts in cached.cuts.items():
        chain = chains[r]
        state = cached.states[r]

        def rows_of(a: int, b: int, chain=chain) -> np.ndarray:
            # The cache keeps every row it asks for (StateCache.insert).
            parts = []
            for start, row, n, _ in chain:
                lo, hi = max(a, start), min(b, start + n)
                if lo < hi:
                    parts.append(stream_rows[row + lo - start: row + hi - start])
                    kept[row + lo - start: row + hi - start] = True
            return np.concatenate(parts)

        for c in cuts:
            ends = [s for start, _, n, s in chain if start + n == c and start < c]
            slot = slots[ends[0]] if slots and ends else -1
            _, taken = cache.insert(state[:c], rows_of, slot)
            if taken:
                kept_segments.add(ends[0])
            kept_tokens[r] = c
    return kept, kept_segments, kept_tokens
