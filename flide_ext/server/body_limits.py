"""Limits on request bodies: their size (``--max-body-mb``) and the time they
may take to arrive (``--body-read-timeout``).

Flide's own rather than Starlette's ``RequestBodyLimitMiddleware``, which
answers in plain text, refuses a declared length only once the route reads or
answers, and leaves the connection open, so the server reads the rest of the
body anyway. Imported by the command line for its defaults, so its imports
are light.
"""

from __future__ import annotations

import asyncio
import math

from ..protocol.errors import FlideError

MAX_BODY_MB = 32.0  # default --max-body-mb, in MiB (2**20 bytes)
BODY_READ_TIMEOUT_S = 30.0  # default --body-read-timeout, in seconds


def body_limits(max_body_mb, body_read_timeout) -> tuple[int, float]:
    """(bytes, seconds) from ``--max-body-mb`` and ``--body-read-timeout``, given
    as numbers or their text.

    Raises:
        FlideError: a value that is not a positive finite number, naming its flag.
    """
    out = []
    for flag, value in (("--max-body-mb", max_body_mb), ("--body-read-timeout", body_read_timeout)):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise FlideError(f"{flag} {value!r} is not a number") from None
        if not math.isfinite(number) or number <= 0:
            raise FlideError(f"{flag} {value} must be a positive number")
        out.append(number)
    return max(1, int(out[0] * 2**20)), out[1]


class _BodyRefused(Exception):
    """A body over the size limit or too slow to arrive (raised by receive)."""

    def __init__(self, response, more: bool = True):
        self.response, self.more = response, more  # more: the body has not all arrived


class BodyLimits:
    """ASGI middleware: a request body may have at most ``max_bytes`` bytes and
    must arrive within ``timeout`` seconds of the request.

    A declared ``Content-Length`` over the limit is refused at once, unread; a
    chunked body as soon as what arrived passes it; either is 413. A body still
    incomplete at the deadline is 408. Both are SGLang's ``ErrorResponse``
    naming ``body`` and the limit's flag, and close the connection. Before it
    closes, whatever more of the body arrives within :data:`LINGER_S` is
    dropped unread, as a web server's lingering close does: closing a socket
    with unread data resets the connection, and the client would lose the
    answer it was sent.
    """

    def __init__(self, app, max_bytes: int, timeout: float):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    def _too_large(self):
        from .http_errors import error_response

        mib, rest = divmod(self.max_bytes, 2**20)
        limit = f"{mib} MiB" if mib and not rest else f"{self.max_bytes} bytes"
        return error_response(413, f"the request body is larger than the {limit} limit (--max-body-mb)", "body",
                              "RequestTooLargeError", close=True)

    def _too_slow(self):
        from .http_errors import error_response

        return error_response(408, f"the request body did not arrive within {self.timeout:g} s "
                              "(--body-read-timeout)", "body", "RequestTimeoutError", close=True)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])  # a repeated name: its last value
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            # A client waiting for "100 Continue" sends nothing more: there is nothing to drop.
            drop = headers.get(b"expect", b"").lower() != b"100-continue"
            return await _refuse(self._too_large(), receive, send, drop)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        received, complete, started = 0, False, False

        async def limited_receive():
            nonlocal received, complete
            if complete:  # past the body: waiting for a disconnect is not bounded here
                return await receive()
            try:
                # A deadline on this task (asyncio.timeout_at), not wait_for's
                # task per receive: the body's parts mostly arrive at once.
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise _BodyRefused(self._too_slow()) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.max_bytes:
                    raise _BodyRefused(self._too_large(), more=not complete)
            else:
                complete = True
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except _BodyRefused as refused:
            if started:
                raise
            await _refuse(refused.response, receive, send, drop=refused.more)


# Seconds a refused body goes on being read, and dropped, before its connection closes.
LINGER_S = 2.0


async def _refuse(response, receive, send, drop: bool) -> None:
    # The whole answer goes out first; the response ends (and uvicorn closes the
    # connection) only once the rest of the body has been dropped, or LINGER_S passed.
    await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
    if not drop:
        await send({"type": "http.response.body", "body": response.body})
        return
    await send({"type": "http.response.body", "body": response.body, "more_body": True})
    loop = asyncio.get_running_loop()
    end = loop.time() + LINGER_S
    while (left := end - loop.time()) > 0:
        try:
            message = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            break
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    await send({"type": "http.response.body", "body": b""})
