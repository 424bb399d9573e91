"""The state cache: a radix tree over token ids whose nodes hold checkpoints.

Each node is an edge of token ids (the tokens after its parent's end). It owns
the K/V pool rows of those tokens (:mod:`.kv_pool`), and, for models with GDN
layers, possibly a state-pool slot: the recurrent states and conv windows right
after its last token. A request resumes from the longest cached prefix of its
prompts that is a *checkpoint*: a position where a cold run's computation can be
cut without changing a bit, a multiple of :data:`ALIGN` tokens from the prompt's
start (fla-core's GDN chunks start there, and ForkAttention's key tiles are
aligned to the path, so nothing moves). For attention-only models every aligned
position of a cached path is one (its K/V rows are all there); with GDN layers
only the ends of nodes holding a slot.

Matching walks the tree along the prompt, so it costs time proportional to the
prompt, not to the number of cached entries. Memory is the pools': rows and
slots are evicted least recently used first, leaves before their parents (a
slot of an inner node may go on its own; its K/V stays for its children).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..kernels.gated_delta_rule import CHUNK
from ..plan.tree import common_prefix

# Checkpoint positions are multiples of this many tokens from the prompt start.
ALIGN = CHUNK
# An eviction frees this fraction (1/EVICT_MARGIN) of the budget beyond what it must.
EVICT_MARGIN = 16


@dataclass(eq=False)
class Node:
    """One radix-tree edge.

    Attributes:
        tokens: ``[n]`` int64 token ids of the edge.
        rows: ``[n]`` int64 K/V pool rows of those tokens.
        start: tokens before the edge (its first token's position).
        slot: GDN state-pool slot of the state after the edge's last token, -1 for none.
    """

    tokens: np.ndarray
    rows: np.ndarray
    start: int
    parent: Optional["Node"] = None
    slot: int = -1
    children: dict = field(default_factory=dict)
    last_used: int = 0
    locks: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class Match:
    """Where a request's state meets the cache.

    Attributes:
        length: tokens it resumes (a checkpoint position; 0: none).
        slot: GDN slot of the checkpoint's state (-1 without GDN layers or when 0).
        rows: ``[length]`` int64 K/V pool rows of the resumed tokens.
        matched: tokens of the state found in the tree (>= length).
        nodes: the nodes the resumed prefix lies on, root side first.
    """

    length: int
    slot: int
    rows: np.ndarray
    matched: int
    nodes: tuple


class StateCache:
    """The radix tree of cached states.

    Args:
        kv_pool: the attention layers' :class:`~.kv_pool.KVPool` (None without
            attention layers).
        release_slot: called with a list of GDN slots the cache frees (None
            without GDN layers).
        max_slots: most GDN slots the cache may hold.
        slot_bytes: bytes of one slot (for :meth:`stats`).
        max_rows: most K/V rows the cache may hold (default: the whole pool; the
            engine leaves a round's rows to the round).
    """

    def __init__(self, kv_pool, release_slot=None, max_slots: int = 0, slot_bytes: int = 0,
                 max_rows: Optional[int] = None):
        self.kv_pool, self.release_slot = kv_pool, release_slot
        self.recurrent = release_slot is not None
        self.max_slots, self.slot_bytes = max_slots, slot_bytes
        self.max_rows = max_rows if max_rows is not None else (kv_pool.rows if kv_pool is not None else 0)
        self._tick = itertools.count(1)
        self.hits = self.cached_tokens_total = self.evicted_nodes = 0
        self._reset()

    def _reset(self) -> None:
        self.root = Node(np.zeros(0, np.int64), np.zeros(0, np.int64), 0)
        self.nodes = self.rows = self.slots = 0

    # -- reading ---------------------------------------------------------------

    def match(self, state: np.ndarray, limit: int) -> Match:
        """The longest checkpoint of ``state`` (a request's shared prefix) within
        its first ``limit`` tokens; marks the nodes on it as recently used.

        Args:
            state: ``[n]`` int64 token ids.
            limit: most tokens the request may resume (fewer than each of its prompts).
        """
        node, pos, path, partial = self.root, 0, [], 0
        tick = next(self._tick)
        n = len(state)
        while pos < n:
            child = node.children.get(int(state[pos]))
            if child is None:
                break
            edge = child.tokens
            same = common_prefix((edge, state[pos:]))
            child.last_used = tick
            if same < len(edge):
                partial = same
                path.append(child)
                pos += same
                break
            path.append(child)
            pos += same
            node = child
        matched = pos
        if self.recurrent:
            best = None
            for i, nd in enumerate(path):
                if nd.slot >= 0 and nd.end <= min(limit, matched) and (i < len(path) - 1 or not partial):
                    best = i
            if best is None:
                return Match(0, -1, np.zeros(0, np.int64), matched, ())
            nodes = tuple(path[: best + 1])
            return Match(nodes[-1].end, nodes[-1].slot, np.concatenate([nd.rows for nd in nodes]), matched, nodes)
        length = min(limit, matched) // ALIGN * ALIGN
        if length == 0 or self.kv_pool is None:
            return Match(0, -1, np.zeros(0, np.int64), matched, ())
        nodes = tuple(nd for nd in path if nd.start < length)
        rows = np.concatenate([nd.rows for nd in nodes])[:length]
        return Match(length, -1, rows, matched, nodes)

    def lock(self, nodes) -> None:
        for nd in nodes:
            nd.locks += 1

    def unlock(self, nodes) -> None:
        for nd in nodes:
            nd.locks -= 1

    # -- writing ---------------------------------------------------------------

    def insert(self, tokens: np.ndarray, rows_of, slot: int) -> tuple[list, bool]:
        """Cache the state of ``tokens`` (a checkpoint position's prefix).

        Args:
            tokens: ``[c]`` int64 token ids, ``c`` a multiple of :data:`ALIGN`.
            rows_of: ``rows_of(a, b)`` -> ``[b - a]`` int64 pool rows holding the
                K/V of tokens ``a..b`` computed this round (only asked for tokens
                not cached yet).
            slot: GDN slot holding the state after ``tokens`` (-1: none).

        Returns:
            ``(rows, slot_taken)``: the rows the cache now owns (the caller frees
            the rest of its round's rows) and whether it took ``slot``.
        """
        node, pos, c = self.root, 0, len(tokens)
        tick = next(self._tick)
        kept = []
        while pos < c:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                rows = np.asarray(rows_of(pos, c), dtype=np.int64)
                child = Node(tokens[pos:c].copy(), rows, pos, node)
                node.children[int(tokens[pos])] = child
                self.nodes += 1
                self.rows += c - pos
                kept.append(rows)
                child.last_used = tick
                node, pos = child, c
                break
            edge = child.tokens
            same = common_prefix((edge, tokens[pos:c]))
            if same < len(edge):
                child = self._split(child, same)
            child.last_used = tick
            node, pos = child, pos + same
        taken = False
        if slot >= 0 and node is not self.root and node.slot < 0:
            node.slot, taken = slot, True
            self.slots += 1
        return kept, taken

    def _split(self, node: Node, at: int) -> Node:
        # The upper part takes the edge's first ``at`` tokens; the slot stays
        # with the lower part, whose end it belongs to.
        upper = Node(node.tokens[:at].copy(), node.rows[:at].copy(), node.start, node.parent,
                     last_used=node.last_used)
        node.parent.children[int(node.tokens[0])] = upper
        node.tokens, node.rows, node.start, node.parent = node.tokens[at:].copy(), node.rows[at:].copy(), node.start + at, upper
        upper.children[int(node.tokens[0])] = node
        self.nodes += 1
        return upper

    # -- memory ----------------------------------------------------------------

    def evict(self, rows_needed: int = 0) -> None:
        """Free least recently used memory until the K/V pool has ``rows_needed``
        free rows, the cache holds at most ``max_rows`` rows and at most
        ``max_slots`` slots; when it has to free anything, it frees
        another ``1/EVICT_MARGIN`` of ``max_rows`` and ``max_slots`` too (as far
        as unlocked nodes allow). Locked nodes (a running round's) are never
        touched; an inner node's slot may go on its own, a node's rows only when
        it is a leaf.
        """
        pool = self.kv_pool
        if not ((pool is not None and (pool.num_free < rows_needed or self.rows > self.max_rows))
                or self.slots > self.max_slots):
            return
        # Once it has to evict, it frees a margin of 1/EVICT_MARGIN of the budget
        # besides: every eviction walks the whole tree, and a cache at its budget
        # would otherwise walk it at every round.
        row_margin, slot_margin = self.max_rows // EVICT_MARGIN, self.max_slots // EVICT_MARGIN

        def short_of_rows():
            return pool is not None and (pool.num_free < rows_needed + row_margin
                                         or self.rows > self.max_rows - row_margin)

        # Least recently used first; of nodes used in the same round (a path matched
        # or inserted at once), the shallower first: the deepest holds the newest
        # checkpoint, the one its request resumes from next.
        heap = [(nd.last_used, nd.end, id(nd), nd) for nd in self._walk()
                if nd.locks == 0 and (not nd.children or nd.slot >= 0)]
        heapq.heapify(heap)
        while heap:
            need_rows = short_of_rows()
            need_slots = self.slots > self.max_slots - slot_margin
            if not need_rows and not need_slots:
                break
            _, _, _, nd = heapq.heappop(heap)
            if nd.parent is None or nd.locks:
                continue  # already removed, or locked
            leaf = not nd.children
            if nd.slot >= 0 and (need_slots or leaf):
                self.release_slot([nd.slot])
                nd.slot = -1
                self.slots -= 1
            if leaf and (need_rows or self.recurrent):
                # A leaf without a state resumes nothing in a GDN model.
                parent = self._remove(nd)
                if parent is not self.root and not parent.children and parent.locks == 0:
                    heapq.heappush(heap, (parent.last_used, parent.end, id(parent), parent))

    def _remove(self, node: Node) -> Node:
        parent = node.parent
        del parent.children[int(node.tokens[0])]
        node.parent = None
        if self.kv_pool is not None:
            self.kv_pool.release(node.rows)
        self.rows -= len(node.tokens)
        self.nodes -= 1
        self.evicted_nodes += 1
        return parent

    def _walk(self):
        stack = list(self.root.children.values())
        while stack:
            nd = stack.pop()
            yield nd
            stack.extend(nd.children.values())

    def flush(self) -> None:
        """Forget every cached state (the caller makes sure no round runs)."""
        for nd in list(self._walk()):
            if nd.slot >= 0:
                self.release_slot([nd.slot])
            if self.kv_pool is not None:
                self.kv_pool.release(nd.rows)
        self._reset()

    def stats(self) -> dict:
        """Nodes, cached tokens (K/V rows held), GDN slots held, their bytes, and
        counters since start (requests that resumed, tokens they resumed, nodes evicted)."""
        row_bytes = self.kv_pool.row_bytes if self.kv_pool is not None else 0
        return {"nodes": self.nodes, "cached_tokens": self.rows, "slots": self.slots,
                "bytes": self.rows * row_bytes + self.slots * self.slot_bytes,
                "hits": self.hits, "cached_tokens_total": self.cached_tokens_total,
                "evicted_nodes": self.evicted_nodes}
