"""Client requests sent to the scheduler and not yet answered: SGLang's
``--max-queued-requests`` and the count of withdrawn requests. A client request
holds one slot however many scheduler requests it becomes
(``--execution-strategy prefix_cache``)."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Iterator, Optional

# SGLang's answer when its waiting queue is full (with HTTP 503).
QUEUE_FULL = "The request queue is full."


class SchedulerUnavailable(RuntimeError):
    """The scheduler cannot take the request (HTTP 503): it failed (its process
    exited, stopped answering, or a round passed the watchdog limit), the server
    is stopping, or ``--max-queued-requests`` are already waiting."""


class QueueSlots:
    """Args:
        limit: most client requests held at once (``--max-queued-requests``); None: no limit.
        metrics: the server's :class:`~.metrics.Metrics`; its ``queued`` gauge reads
            :attr:`count`, its ``aborted`` counter counts withdrawn requests.
    """

    def __init__(self, limit: Optional[int], metrics):
        self.limit = limit
        self.count = 0
        self.metrics = metrics
        metrics.queued.set_function(lambda: self.count)

    @contextmanager
    def held(self) -> Iterator[None]:
        """One client request's slot while its answer is awaited; a request
        cancelled inside it (its client went away, or it timed out) counts as aborted.

        Raises:
            SchedulerUnavailable: :data:`QUEUE_FULL`, ``limit`` slots are held.
        """
        if self.limit is not None and self.count >= self.limit:
            raise SchedulerUnavailable(QUEUE_FULL)
        self.count += 1
        try:
            yield
        except asyncio.CancelledError:
            self.metrics.aborted.inc()
            raise
        finally:
            self.count -= 1
