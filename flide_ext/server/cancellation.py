"""A request's answer, awaited only while its client waits for it and within
``--request-timeout``.

Otherwise the work is cancelled, and the tokenizer manager withdraws the request
from the scheduler (an :class:`~.io_struct.Abort`): a request that has not
started never runs, and a running round stops early once none of its requests
is awaited any more (:mod:`.withdrawals`). The client
going away is seen on the ASGI channel (its ``http.disconnect`` message, which
comes once the body has been read), so the body is never read twice.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Optional


class ClientDisconnected(Exception):
    """The client closed its connection before its answer was ready."""


class RequestTimedOut(Exception):
    """The request passed ``--request-timeout`` (HTTP 504).

    Attributes:
        seconds: the limit it passed.
    """

    def __init__(self, seconds: float):
        super().__init__(f"the request took longer than --request-timeout ({seconds:g} s) and was withdrawn")
        self.seconds = seconds


async def _disconnected(receive: Callable[[], Awaitable[dict]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def while_client_waits(receive: Callable[[], Awaitable[dict]], work: Awaitable,
                             timeout: Optional[float] = None):
    """``await work``, unless the client disconnects first or it takes longer
    than ``timeout`` seconds; then ``work`` is cancelled (and what it does on
    cancellation is done before this returns).

    ``work`` runs in the calling task (no task of its own, so its answer reaches
    the caller without another turn of the event loop); a watcher task reads
    ``receive`` and cancels the caller when the client goes.

    Args:
        receive: the request's ASGI receive channel, its body already read.
        work: the answer to await (a coroutine or future).
        timeout: seconds (None: no limit).

    Returns:
        What ``work`` returns (its exception is raised).

    Raises:
        ClientDisconnected: the client went away first.
        RequestTimedOut: ``timeout`` passed first.
    """
    caller = asyncio.current_task()
    left, over = False, False

    def on_disconnect(watch: asyncio.Future) -> None:
        nonlocal left
        if over or watch.cancelled() or watch.exception() is not None:
            return
        left = True
        caller.cancel()

    watch = asyncio.ensure_future(_disconnected(receive))
    watch.add_done_callback(on_disconnect)
    limit = asyncio.timeout(timeout)
    try:
        async with limit:
            return await work
    except asyncio.CancelledError:
        # Ours (the client left) unless someone else cancelled the caller too.
        if left and caller.uncancel() == 0:
            raise ClientDisconnected() from None
        raise
    except TimeoutError:
        if limit.expired():  # not a TimeoutError of the work's own
            raise RequestTimedOut(timeout) from None
        raise
    finally:
        over = True  # answered (or failed): a disconnect seen from now on cancels nothing
        watch.cancel()
