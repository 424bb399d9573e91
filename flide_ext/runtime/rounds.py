"""Packing waiting requests into rounds under a token and a segment capacity.

A round is one flat stream: its tokens are the sum of its requests' prefix-tree
segments (a shared state counted once), and each segment is one row of the
segment tables every kernel walks. Both are bounded per round (GPU buffers,
CUDA-graph capacities), so the scheduler packs waiting requests in arrival
order, taking every request that still fits: a request never waits behind a
round that could have held it. A request larger than a whole round is refused
with a :class:`~flide_ext.protocol.errors.RequestError` naming the field, never truncated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..protocol.errors import RequestError
from ..plan.tree import build_prefix_tree


@dataclass(frozen=True)
class RequestSize:
    """What one request adds to a round.

    Attributes:
        tokens: flat-stream tokens of its prefix tree (each shared prefix once).
        segments: segments of its prefix tree.
    """

    tokens: int
    segments: int


@dataclass(frozen=True)
class RoundCapacity:
    """Most stream tokens and segments one round may hold, and most requests.

    Raises:
        ValueError: a capacity below 1 or not an integer.
    """

    tokens: int = 65536
    segments: int = 4096
    requests: int = 256

    def __post_init__(self):
        for name in ("tokens", "segments", "requests"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"round {name} capacity must be a positive integer, not {value!r}")

    def check(self, size: RequestSize, field: str = "prompts") -> None:
        """Refuse a request no round can hold.

        Raises:
            RequestError: on ``field``, with the request's size and the capacity.
        """
        if size.tokens > self.tokens or size.segments > self.segments:
            raise RequestError(
                field,
                f"needs {size.tokens} stream tokens in {size.segments} segments, more than one round holds "
                f"({self.tokens} tokens, {self.segments} segments); send fewer or shorter prompts",
            )


def request_size(prompts: Sequence[Sequence[int]]) -> RequestSize:
    """Stream tokens and segments of one request's prefix tree (before any
    checkpoint resumption, which only makes it smaller)."""
    tree = build_prefix_tree([0] * len(prompts), prompts)
    return RequestSize(sum(len(seg.tokens) for seg in tree.segments), len(tree.segments))


def pack_round(sizes: Sequence[Optional[RequestSize]], capacity: RoundCapacity) -> list[int]:
    """Which waiting requests the next round takes.

    Args:
        sizes: the waiting requests in arrival order (None: already refused, skipped).
        capacity: the round's capacity; every size must pass :meth:`RoundCapacity.check`.

    Returns:
        Indices into ``sizes``, ascending: each request, in order, that still fits
        in what the requests before it left (so the first that fits a round
        always goes).
    """
    taken, tokens, segments = [], 0, 0
    for i, size in enumerate(sizes):
        if size is None or len(taken) == capacity.requests:
            continue
        if tokens + size.tokens <= capacity.tokens and segments + size.segments <= capacity.segments:
            taken.append(i)
            tokens += size.tokens
            segments += size.segments
    return taken
