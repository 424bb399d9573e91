"""How much one round may hold: stream tokens, prefix-tree segments, requests.

The one source of the round-capacity defaults (the engine, the scheduler, the
server's flags and their help text all read :class:`RoundCapacity`). Light to
import: the server's argument parsing reads it before any model code loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol.errors import RequestError


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
