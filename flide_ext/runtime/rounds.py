"""Packing waiting requests into rounds under a token and a segment capacity.

A round is one flat stream: its tokens are the sum of its requests' prefix-tree
segments (a shared state counted once), and each segment is one row of the
segment tables every kernel walks. Both are bounded per round (GPU buffers,
CUDA-graph capacities), so the scheduler packs waiting requests in arrival
order, taking every request that still fits: a request never waits behind a
round that could have held it. A request larger than a whole round is refused
with a :class:`~flide_ext.protocol.errors.RequestError` naming the field, never truncated.

A round may also be held to a time budget (:class:`RoundPace`): fewer tokens
than the capacity, so a burst is answered in several short rounds rather than
one long one. Which round a request joins never changes its answer's bits.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Optional, Sequence, TypeVar

from ..plan.tree import MAX_TREE_DEPTH, PrefixTree, build_prefix_tree
from ..protocol.errors import RequestError
from .capacity import RequestSize, RoundCapacity


def request_size(prompts: Sequence[Sequence[int]], field: str = "prompts") -> RequestSize:
    """Stream tokens and segments of one request's prefix tree (before any
    checkpoint resumption, which only makes it smaller).

    Args:
        prompts: the request's prompts, token-id lists or ``[n]`` int64 arrays
            (arrays are not copied).
        field: the request field the prompts came from, named in errors.

    Raises:
        RequestError: on ``field``, when the prompts nest deeper than
            :data:`~flide_ext.plan.tree.MAX_TREE_DEPTH` levels.
    """
    return tree_size(build_prefix_tree([0] * len(prompts), prompts), field)


def tree_size(tree: PrefixTree, field: str = "prompts") -> RequestSize:
    """:func:`request_size` of a request's prefix tree already built (the
    tokenizer manager's, whose root also gives the prompts' shared prefix)."""
    if tree.num_levels > MAX_TREE_DEPTH:
        raise RequestError(field, f"nest {tree.num_levels} levels deep (each extending a fork of another); "
                                  f"at most {MAX_TREE_DEPTH} are served")
    return RequestSize(sum(len(seg.tokens) for seg in tree.segments), len(tree.segments))


def pack_round(sizes: Sequence[Optional[RequestSize]], capacity: RoundCapacity,
               budget: Optional[int] = None) -> list[int]:
    """Which waiting requests the next round takes.

    Args:
        sizes: the waiting requests in arrival order (None: already refused, skipped).
        capacity: the round's capacity; every size must pass :meth:`RoundCapacity.check`.
        budget: at most this many stream tokens (a time budget's share,
            :class:`RoundPace`), below the capacity's; None: the capacity's.

    Returns:
        Indices into ``sizes``, ascending: the first request, then each one, in
        order, that still fits in what the requests before it left. The first
        always goes, whatever the budget, so no request waits forever.
    """
    most = capacity.tokens if budget is None else min(capacity.tokens, budget)
    taken, tokens, segments = [], 0, 0
    for i, size in enumerate(sizes):
        if size is None or len(taken) == capacity.requests:
            continue
        if not taken or (tokens + size.tokens <= most and segments + size.segments <= capacity.segments):
            taken.append(i)
            tokens += size.tokens
            segments += size.segments
    return taken


Item = TypeVar("Item")


class RoundQueue(Generic[Item]):
    """Waiting requests in arrival order, taken a round at a time by :func:`pack_round`.

    The one packing loop of the engine's batch methods and of the scheduler
    process: :meth:`put` a request with its size (refused first if no round can
    hold it: :meth:`RoundCapacity.check`), then :meth:`next_round` takes every
    waiting request that still fits, in order, leaving the rest for the next.

    Args:
        capacity: the rounds' capacity.
    """

    def __init__(self, capacity: RoundCapacity):
        self.capacity = capacity
        self._waiting: deque = deque()

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, item: Item, size: RequestSize, field: str = "prompts") -> None:
        """Queue ``item`` of ``size``.

        Raises:
            RequestError: no round can hold it (naming ``field``); nothing is queued.
        """
        self.capacity.check(size, field)
        self._waiting.append((item, size, field))

    def resize(self, size_of) -> list:
        """Measure every waiting item again (``size_of(item)`` -> RequestSize: what
        it needs in a round run now); those no round can hold any more leave the
        queue.

        Returns:
            ``[(item, RequestError)]`` for the items that left, in arrival order
            (the error names the field they were queued with).
        """
        kept, refused = deque(), []
        for item, _, field in self._waiting:
            size = size_of(item)
            try:
                self.capacity.check(size, field)
            except RequestError as e:
                refused.append((item, e))
                continue
            kept.append((item, size, field))
        self._waiting = kept
        return refused

    def remove(self, match) -> list:
        """Withdraw the waiting items for which ``match(item)`` is true.

        Returns:
            The withdrawn items, in arrival order.
        """
        gone = [item for item, _, _ in self._waiting if match(item)]
        if gone:
            self._waiting = deque(entry for entry in self._waiting if not match(entry[0]))
        return gone

    def next_round(self, budget: Optional[int] = None) -> list:
        """The items of the next round, in arrival order (empty when none wait);
        ``budget`` caps its stream tokens, as in :func:`pack_round`."""
        waiting = list(self._waiting)
        taken = set(pack_round([size for _, size, _ in waiting], self.capacity, budget))
        self._waiting = deque(entry for i, entry in enumerate(waiting) if i not in taken)
        return [item for i, (item, _, _) in enumerate(waiting) if i in taken]


def check_per_request(flags: Optional[Sequence], requests: int, name: str = "over_labels") -> None:
    """One entry of ``flags`` per request of a batch (None: no flags given).

    Raises:
        ValueError: ``flags`` has another length, naming ``name``.
    """
    if flags is not None and len(flags) != requests:
        raise ValueError(f"{name} has {len(flags)} flags for {requests} requests")


def queue_batch(capacity: RoundCapacity, items: list, prompts_of, field: str) -> tuple[list, RoundQueue]:
    """A batch's requests in one round queue (the engine's batch methods).

    Args:
        capacity: the rounds' capacity.
        items: the requests; a RequestError among them stays as it is.
        prompts_of: ``prompts_of(item)`` -> its prompts (for :func:`request_size`).
        field: the request field they came from, named in errors.

    Returns:
        ``(checked, queue)``: ``items`` with each one no round can hold replaced
        by its RequestError, and a queue of the others, each by its index among
        the others.
    """
    out, queue, kept = [], RoundQueue(capacity), 0
    for item in items:
        if not isinstance(item, RequestError):
            try:
                queue.put(kept, request_size(prompts_of(item), field), field)
                kept += 1
            except RequestError as e:
                item = e
        out.append(item)
    return out, queue


class RoundPace:
    """How many stream tokens a round may take to last about ``seconds``.

    Estimated from the rounds already run: seconds per stream token, averaged
    over past rounds weighted by their tokens and halving each older round's
    weight, so large rounds (where a round's fixed cost matters least) count
    most and a change of load is followed within a few rounds.

    Args:
        seconds: the rounds' time budget, in seconds (> 0).

    Raises:
        ValueError: ``seconds`` is not positive.
    """

    def __init__(self, seconds: float):
        if not seconds > 0:
            raise ValueError(f"a round's time budget must be positive seconds, not {seconds!r}")
        self.seconds = seconds
        self._seconds = 0.0
        self._tokens = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """A round of ``tokens`` stream tokens took ``seconds``."""
        if tokens > 0:
            self._seconds = self._seconds / 2 + seconds
            self._tokens = self._tokens / 2 + tokens

    def budget(self) -> int:
        """Stream tokens the next round may hold (0 before any round ran: the
        first request alone, which :func:`pack_round` always takes, measures the pace)."""
        if self._tokens == 0:
            return 0
        if self._seconds <= 0:
            return 2**62  # rounds faster than the clock: no bound but the capacity
        return int(self.seconds * self._tokens / self._seconds)
