"""Messages between the tokenizer manager and the scheduler process."""

from __future__ import annotations

from dataclasses import dataclass, field
import time
from typing import List, Optional

import numpy as np

from ..plan.tree import common_prefix
from ..runtime.capacity import RequestSize


@dataclass
class ScoreWork:
    """One request's prompts for the next round. Every request resumes from the
    longest cached checkpoint of its state and leaves its own state behind (the
    engine's state cache does this by itself).

    The prompts travel as the prefix they all share and each one's own rest, so
    a long history shared by every question is pickled once (:meth:`pack`).

    Attributes:
        rid: request id, unique in the server's lifetime.
        shared: ``[n]`` int64 token ids every prompt starts with.
        rests: per prompt, ``[m]`` int64 token ids after ``shared``.
        labels: label token ids per prompt.
        size: the request's prefix-tree size, measured by the tokenizer manager
            (None: the scheduler measures it).
        sent: when the tokenizer manager sent it (``time.time()``, seconds).
        field: the request field the prompts came from, named when the scheduler
            refuses the request (no round can hold what it still has to compute).
        request_id: the HTTP request's id (``X-Request-Id``, the log lines'
            ``rid=``), which the scheduler's error lines name.
        over_labels: answer each prompt's labels normalised over its labels
            alone (only their logits are computed), not over the vocabulary.
    """

    rid: int
    shared: np.ndarray
    rests: List[np.ndarray]
    labels: List[List[int]]
    size: Optional[RequestSize] = None
    sent: float = 0.0
    field: str = "prompts"
    request_id: str = "-"
    over_labels: bool = False

    @classmethod
    def pack(cls, rid: int, prompts: List[np.ndarray], labels: List[List[int]],
             size: Optional[RequestSize] = None, field: str = "prompts",
             shared: Optional[int] = None, request_id: str = "-", over_labels: bool = False) -> "ScoreWork":
        """A ScoreWork of ``prompts`` (non-empty ``[n]`` int64 arrays), split at
        their common prefix (``shared`` tokens when the caller knows it already:
        :attr:`~flide_ext.plan.tree.PrefixTree.shared_tokens`)."""
        n = common_prefix(prompts) if shared is None else shared
        return cls(rid, prompts[0][:n], [p[n:] for p in prompts], labels, size, time.time(), field, request_id,
                   over_labels)

    @property
    def state(self) -> np.ndarray:
        """The request's state (:func:`flide_ext.runtime.checkpoints.state_of`):
        the shared prefix, less its last token when a prompt ends there."""
        return self.shared[:-1] if any(len(rest) == 0 for rest in self.rests) else self.shared

    @property
    def prompts(self) -> List[np.ndarray]:
        """The full prompts, ``[n]`` int64 each."""
        return [np.concatenate((self.shared, rest)) for rest in self.rests]


@dataclass
class ScoreDone:
    """The scheduler's answer to one ScoreWork.

    Attributes:
        rid: the request's id.
        label_logprobs: per prompt, the log-probability of each label over the
            full vocabulary (over its labels alone for a ScoreWork ``over_labels``).
        stream_tokens: tokens of the round's flat stream that belong to this request.
        round_requests: requests in the round.
        cached_tokens: prompt tokens resumed from the state cache, summed over the
            request's prompts as ``prompt_tokens`` is (SGLang's
            ``usage.prompt_tokens_details.cached_tokens``).
        error: a message when the round failed (the request gets HTTP 500), or
            why it was refused (with ``error_field``: HTTP 400).
        error_field: the request field a refusal names.
        cache: ``Engine.cache_stats()`` after the round (for ``/metrics``).
        stages: seconds the request spent in the scheduler, by stage: ``queue``
            (from being sent until its round starts), then its round's ``plan``, ``forward`` and
            ``finish`` (:class:`~flide_ext.runtime.round_result.RoundStats`; the
            last one also holds the scheduler's own work on the answers).
    """

    rid: int
    label_logprobs: Optional[List[List[float]]] = None
    stream_tokens: int = 0
    round_requests: int = 0
    cached_tokens: int = 0
    error: Optional[str] = None
    cache: Optional[dict] = None
    stages: dict = field(default_factory=dict)
    error_field: Optional[str] = None


@dataclass
class FlushCache:
    """Empty the state cache (``/flush_cache``), between two rounds."""

    rid: int


@dataclass
class FlushCacheDone:
    """The scheduler's answer to a FlushCache.

    Attributes:
        rid: the FlushCache's id.
        error: a message when the flush failed.
        cache: ``Engine.cache_stats()`` after the flush.
    """

    rid: int
    error: Optional[str] = None
    cache: Optional[dict] = None


@dataclass
class SchedulerReady:
    """Sent once the model is loaded; ``info["cache"]`` is ``Engine.cache_stats()``."""

    vocab_size: int
    context_length: int
    info: dict = field(default_factory=dict)


@dataclass
class Abort:
    """Withdraw request ``rid`` (its client went away, or it passed
    ``--request-timeout``), sent on the work socket and on the abort socket
    (:mod:`.withdrawals`): the scheduler drops it if it still waits, and stops
    the running round that holds it once every request of that round is
    withdrawn (a round that still has one awaited runs on). Its answer is not
    awaited."""

    rid: int


@dataclass
class RoundCut:
    """The scheduler stopped a round before its end because every one of its
    requests was withdrawn while it ran; none of them is answered.

    Attributes:
        rids: the round's requests.
        cache: ``Engine.cache_stats()`` after it (for ``/metrics``: the cut round
            kept nothing, but making room for it may have evicted).
    """

    rids: List[int]
    cache: Optional[dict] = None


@dataclass
class Heartbeat:
    """The scheduler's sign of life, sent by a thread of its own every interval,
    whatever its rounds are doing.

    Attributes:
        round_seconds: how long the round now running has run (None between
            rounds), for the watchdog (``--watchdog-timeout``).
    """

    round_seconds: Optional[float] = None
