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
    than ``timeout`` seconds; then ``work`` is cancelled (and awaited, so what
    it does on cancellation is done).

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
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, gone), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
    if not task.cancelled():
        return task.result()  # done first (or together with the disconnect): answered
    if gone.done() and not gone.cancelled():
        raise ClientDisconnected()
    raise RequestTimedOut(timeout)
