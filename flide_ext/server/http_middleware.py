"""The HTTP server's outermost middleware: request ids and per-route metrics.

Plain ASGI rather than ``@app.middleware("http")``, whose wrapper runs each
request through an extra task and body stream.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from starlette.routing import Match

from .metrics import Metrics
from .request_ids import HEADER, RID, request_id

# The route label of a request that matches no route: one series for every
# unknown path, however many there are.
UNMATCHED = "unmatched"
_LABELS_KEPT = 1024


def route_label(routes, scope: dict) -> str:
    """The path template of the route a request is for (``/v1/decisions``; a
    route whose path matches but not its method counts too), or
    :data:`UNMATCHED`."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return route.path
        if match is Match.PARTIAL and partial is None:
            partial = route.path
    return partial or UNMATCHED


class RequestObserver:
    """Outermost ASGI middleware: gives each HTTP request its id (:data:`RID`,
    echoed as ``X-Request-Id`` on the response), and observes in ``metrics``
    its route template, status and seconds from its arrival at the app until
    its answer went out. A request whose app fails before answering is counted
    as 500."""

    def __init__(self, app, metrics: Metrics, router):
        self.app, self.metrics, self.router = app, metrics, router
        # (method, path) -> label of a matched request: matching every route
        # costs tens of microseconds. Unmatched paths are not kept (any number
        # of them may come); the bound covers routes with path parameters.
        self._labels: dict = {}

    def _label(self, scope) -> str:
        key = (scope["method"], scope["path"])
        label = self._labels.get(key)
        if label is None:
            label = route_label(self.router.routes, scope)
            if label != UNMATCHED and len(self._labels) < _LABELS_KEPT:
                self._labels[key] = label
        return label

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        rid = request_id(scope)
        RID.set(rid)  # this request's task (and the threads it starts) only
        route = self._label(scope)
        status, answered = 500, None
        echo = (HEADER, rid.encode("ascii"))

        async def send_with_id(message):
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), echo]}
            elif message.get("body") or (answered is None and not message.get("more_body", False)):
                answered = time.perf_counter()  # the answer's last bytes handed to the server
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            # Until the answer went out, not until the app returned: a refused body's
            # connection lingers after its answer (body_limits.LINGER_S).
            self.metrics.observe(route, status, (answered or time.perf_counter()) - start)


class ObservedApp(FastAPI):
    """FastAPI with :class:`RequestObserver` outside Starlette's error middleware,
    so the 500 that one sends for a failing route carries the request id and is
    counted too.

    Args:
        metrics: where requests are observed.
    """

    def __init__(self, metrics: Metrics, **kwargs):
        super().__init__(**kwargs)
        self.observed_metrics = metrics

    def build_middleware_stack(self):
        return RequestObserver(super().build_middleware_stack(), self.observed_metrics, self.router)
