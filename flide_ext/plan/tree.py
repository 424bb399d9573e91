"""The logical prefix tree of a round.

Each request's prompts (token id lists) are merged into a radix tree over token
ids: a node is a *segment* of tokens and its children fork from the segment's
last token. Prompts of different requests never share a segment, even when their
tokens agree (DESIGN.md: forking happens within a request).

A segment ends wherever one of its prompts ends or two prompts part, so every
prompt's last token is the last token of some segment; that token's row is the
prompt's readout row.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..kernels.fork_attention.paths import PATH_DEPTH

# Levels a request's prompts may nest. The GPU ForkAttention walks each path
# through a fixed table of PATH_DEPTH segments, one of them the checkpoint a
# request may resume from; the limit is the same on every device so a request
# is accepted or refused wherever it runs.
MAX_TREE_DEPTH = PATH_DEPTH - 1


@dataclass
class Segment:
    """One node of the prefix tree.

    Attributes:
        request: index of the request the segment belongs to.
        parent: index of the parent segment in ``PrefixTree.segments``, -1 for a root.
        tokens: ``[n]`` int64 the segment's token ids (a view of its prompt's array).
        logical_start: logical position of the first token (its index in every
            prompt that passes through this segment).
        depth: 0 for a root, parent's depth + 1 otherwise.
    """

    request: int
    parent: int
    tokens: np.ndarray
    logical_start: int
    depth: int


@dataclass
class PrefixTree:
    """Segments in level order (every parent before its children; within a
    level by request, then by first appearance), and for each prompt the
    segment whose last token is the prompt's last token."""

    segments: list[Segment] = field(default_factory=list)
    readout_segment: list[int] = field(default_factory=list)

    @property
    def num_levels(self) -> int:
        return 1 + max((s.depth for s in self.segments), default=-1)

    @property
    def shared_tokens(self) -> int:
        """Tokens every prompt starts with, for a one-request tree: its root's,
        when it has only one (:func:`common_prefix` of the prompts, found already)."""
        if not self.segments or (len(self.segments) > 1 and self.segments[1].depth == 0):
            return 0
        return len(self.segments[0].tokens)

    def path(self, segment: int) -> list[int]:
        """Segment indices from the root down to ``segment``, inclusive."""
        out = []
        while segment >= 0:
            out.append(segment)
            segment = self.segments[segment].parent
        return out[::-1]


def common_prefix(arrays: Sequence[np.ndarray], start: int = 0) -> int:
    """Length of the prefix that all ``arrays[i][start:]`` share (``[n]`` integer
    arrays; at most the shortest one's length less ``start``)."""
    first = arrays[0]
    length = min(len(a) for a in arrays) - start
    for a in arrays[1:]:
        if length <= 0:
            break
        # argmax finds the first difference in one call (flatnonzero costs
        # three Python-level calls, and this runs per tree node and per edge
        # of every cache walk).
        diff = a[start : start + length] != first[start : start + length]
        at = int(diff.argmax())
        if diff[at]:
            length = at
    return length


def _group_by_token(items: list[int], arrays: list[np.ndarray], position: int) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for i in items:
        groups.setdefault(int(arrays[i][position]), []).append(i)
    return list(groups.values())


def build_prefix_tree(requests: Sequence[int], prompts: Sequence[Sequence[int]]) -> PrefixTree:
    """Build the round's prefix tree.

    Args:
        requests: for each prompt, the index of its request.
        prompts: for each prompt, its token ids (non-empty).

    Returns:
        The tree; ``readout_segment[i]`` is the segment ending with prompt i.

    Raises:
        ValueError: a prompt is empty, or the two lists differ in length.
    """
    if len(requests) != len(prompts):
        raise ValueError("requests and prompts must have the same length")
    arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
    if any(a.size == 0 for a in arrays):
        raise ValueError("every prompt needs at least one token")

    by_request: dict[int, list[int]] = {}
    for i, r in enumerate(requests):
        by_request.setdefault(int(r), []).append(i)

    built: list[Segment] = []
    readout = [-1] * len(prompts)
    # (prompt indices, start position, parent, depth, request)
    queue = deque()
    for r, items in by_request.items():
        for group in _group_by_token(items, arrays, 0):
            queue.append((group, 0, -1, 0, r))
    while queue:
        items, start, parent, depth, r = queue.popleft()
        index = len(built)
        if len(items) == 1:  # a leaf: the rest of its prompt (most questions)
            built.append(Segment(r, parent, arrays[items[0]][start:], start, depth))
            readout[items[0]] = index
            continue
        end = start + common_prefix([arrays[i] for i in items], start)
        built.append(Segment(r, parent, arrays[items[0]][start:end], start, depth))
        rest = []
        for i in items:
            if len(arrays[i]) == end:
                readout[i] = index
            else:
                rest.append(i)
        for group in _group_by_token(rest, arrays, end):
            queue.append((group, end, index, depth + 1, r))

    # Breadth-first construction from every request's roots at once yields
    # level order (by depth, then request) when requests first appear in index
    # order, as a round's do; otherwise a stable sort restores it.
    if all((a.depth, a.request) <= (b.depth, b.request) for a, b in zip(built, built[1:])):
        return PrefixTree(built, readout)
    order = sorted(range(len(built)), key=lambda s: (built[s].depth, built[s].request, s))
    new_index = {old: new for new, old in enumerate(order)}
    segments = []
    for old in order:
        s = built[old]
        parent = new_index[s.parent] if s.parent >= 0 else -1
        segments.append(Segment(s.request, parent, s.tokens, s.logical_start, s.depth))
    return PrefixTree(segments, [new_index[s] for s in readout])

