"""Checkpoints of states: resume a growing history from its longest saved prefix.

A checkpoint of a token prefix keeps what the model needs to continue after it
without recomputing it: for every GDN layer the recurrent state and conv window
(one state-pool slot), and for every attention layer the prefix's K/V. A request
whose prompts all extend a checkpoint strictly resumes from the longest one and
computes only its new tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..plan.flat import Resume


@dataclass
class Checkpoint:
    """Attributes:
        tokens: the prefix's token ids.
        slot: its GDN state-pool slot, -1 for models without GDN layers.
        kv: per attention layer, ``(k, v)`` ``[len(tokens), Hkv, D]``.
    """

    tokens: tuple
    slot: int
    kv: list

    def __len__(self) -> int:
        return len(self.tokens)


class CheckpointStore:
    """Least-recently-used checkpoints: at most ``capacity`` of them, covering at
    most ``max_tokens`` tokens together (their K/V is the memory that grows).

    Args:
        capacity: checkpoints kept; the least recently used is evicted first.
        release_slot: called with a list of GDN slots when their checkpoint is evicted.
        max_tokens: total tokens over all kept checkpoints.
    """

    def __init__(self, capacity: int, release_slot, max_tokens: int = 1 << 18):
        self.capacity = capacity
        self.max_tokens = max_tokens
        self.release_slot = release_slot
        self.entries: "OrderedDict[tuple, Checkpoint]" = OrderedDict()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.entries)

    def longest_prefix(self, prompts: Sequence[Sequence[int]]) -> Optional[Checkpoint]:
        """The longest checkpoint that is a strict prefix of every prompt."""
        shortest = min(len(p) for p in prompts)
        best = None
        for key, ckpt in self.entries.items():
            n = len(key)
            if n >= shortest or (best is not None and n <= len(best)):
                continue
            if all(tuple(p[:n]) == key for p in prompts):
                best = ckpt
        if best is not None:
            self.entries.move_to_end(best.tokens)
        return best

    def add(self, checkpoint: Checkpoint) -> bool:
        """Keep a checkpoint; returns False (and keeps nothing) when the same prefix
        is already kept, so the caller can release the new slot."""
        if checkpoint.tokens in self.entries:
            self.entries.move_to_end(checkpoint.tokens)
            return False
        if len(checkpoint) > self.max_tokens or self.capacity < 1:
            return False
        self.entries[checkpoint.tokens] = checkpoint
        self.tokens += len(checkpoint)
        while len(self.entries) > self.capacity or self.tokens > self.max_tokens:
            _, old = self.entries.popitem(last=False)
            self.tokens -= len(old)
            if old.slot >= 0:
                self.release_slot([old.slot])
        return True

    def discard(self, tokens: Sequence[int]) -> None:
        """Forget the checkpoint of exactly these tokens, if kept (freeing its slot)."""
        old = self.entries.pop(tuple(tokens), None)
        if old is not None:
            self.tokens -= len(old)
            if old.slot >= 0:
                self.release_slot([old.slot])

    def clear(self) -> None:
        for ckpt in self.entries.values():
            if ckpt.slot >= 0:
                self.release_slot([ckpt.slot])
        self.entries.clear()
        self.tokens = 0


def concat_kv(base: Optional[Checkpoint], new_kv: list, rows: torch.Tensor) -> list:
    """K/V of a new checkpoint: the base checkpoint's rows, then ``rows`` of each
    attention layer's stream K/V (``new_kv``)."""
    out = []
    for i, (k, v) in enumerate(new_kv):
        k, v = k[rows], v[rows]
        if base is not None:
            k, v = torch.cat([base.kv[i][0], k]), torch.cat([base.kv[i][1], v])
        out.append((k, v))
    return out


def resume_from(store: CheckpointStore, groups) -> tuple[dict, dict, Optional[list]]:
    """The checkpoints a round's requests resume from.

    Args:
        store: the kept checkpoints.
        groups: per request ``(prompts, labels)``.

    Returns:
        ``(resumed, resume, kv_prefix)``: request index -> its :class:`Checkpoint`;
        request index -> the plan's :class:`~flide_ext.plan.flat.Resume` (its K/V
        rows in the round's key prefix, requests in index order); per attention
        layer the key prefix ``(k, v)``, or None when no request resumes.
    """
    resumed: dict[int, Checkpoint] = {}
    if len(store):
        for r, (prompts, _) in enumerate(groups):
            ckpt = store.longest_prefix(prompts)
            if ckpt is not None:
                resumed[r] = ckpt
    order = sorted(resumed)
    resume, offset = {}, 0
    for r in order:
        resume[r] = Resume(len(resumed[r]), resumed[r].slot, offset)
        offset += len(resumed[r])
    kv_prefix = None
    if resumed:
        layers = len(resumed[order[0]].kv)
        kv_prefix = [(torch.cat([resumed[r].kv[i][0] for r in order]), torch.cat([resumed[r].kv[i][1] for r in order]))
                     for i in range(layers)]
    return resumed, resume, kv_prefix


def keep_states(store: CheckpointStore, plan, groups, keep_state, resumed: dict, slots: list, capture: Optional[list],
                device) -> tuple[set, dict]:
    """Keep the states asked for as checkpoints: each such request's root segment
    (the prefix all its prompts share), on top of the checkpoint it resumed from.

    Args:
        store: where checkpoints are kept.
        plan: the round's plan; groups: per request ``(prompts, labels)``.
        keep_state: per request, whether to keep its state.
        resumed: request index -> the checkpoint it resumed from.
        slots: per real segment its GDN slot (empty without GDN layers).
        capture: each attention layer's stream ``(k, v)`` (None: nothing to keep).
        device: where the stream's K/V lie.

    Returns:
        ``(segments, kept_tokens)``: the segments whose slots now belong to
        checkpoints, and request index -> tokens of its kept checkpoint.
    """
    segments, kept_tokens = set(), {}
    if capture is None:
        return segments, kept_tokens
    roots: dict[int, list[int]] = {}
    for s, seg in enumerate(plan.tree.segments):
        if seg.parent < 0:
            roots.setdefault(seg.request, []).append(s)
    for r, keep in enumerate(keep_state):
        base = resumed.get(r)
        if not keep or len(roots.get(r, [])) != 1:
            continue  # a request whose prompts part at once shares no state
        s = roots[r][0]
        start, length = int(plan.seg_start[s]), int(plan.seg_len[s])
        base_len = len(base) if base is not None else 0
        tokens = tuple(groups[r][0][0][: base_len + length])
        rows = torch.arange(start, start + length, device=device)
        slot = slots[s] if slots else -1
        if store.add(Checkpoint(tokens, slot, concat_kv(base, capture, rows))):
            segments.add(s)
        if tokens in store.entries:  # kept now or already (not refused by the budget)
            kept_tokens[r] = len(tokens)
    return segments, kept_tokens
