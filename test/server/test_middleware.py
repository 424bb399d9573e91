"""The HTTP server's app in process (a stand-in tokenizer manager): SGLang's
API-key and Content-Type manners compared with SGLang's own code, request ids,
per-route metrics, body limits and the probes."""

from __future__ import annotations

import asyncio
import random
import re
import time
from types import SimpleNamespace

import httpx
import pytest
from pydantic import BaseModel
from sglang.srt.entrypoints.openai.protocol import DecisionRequest, ScoringRequest
from sglang.srt.entrypoints.systemone.protocol import SystemOneRequest

from flide_ext.protocol.errors import RequestError
from flide_ext.server import body_limits, http_server
from flide_ext.server.http_server import ServerInfo, build_app
from flide_ext.server.metrics import Metrics

KEY = "k"


class Answer(BaseModel):
    ok: bool = True


class StandIn:
    """The tokenizer manager's face to the routes, without a scheduler."""

    def __init__(self, handler=None):
        self.scheduler_error = None
        self.request_timeout = None  # --request-timeout: none
        self.handler = handler
        self.calls = 0
        self.probes = 0
        self.probe_answer = None  # None: answered at once; else an exception to raise, "hang" or "busy"
        self.last_answer = 0.0  # the scheduler's latest answer (time.monotonic())
        self.withdrawn = 0  # probes cancelled while they waited

    def start(self):
        pass

    async def _handle(self, body):
        self.calls += 1
        return await self.handler(body) if self.handler else Answer()

    decide = decide_systemone = score_request = _handle

    async def flush_cache(self):
        return SimpleNamespace(error=None)

    async def probe(self):
        self.probes += 1
        try:
            if self.probe_answer == "hang":
                await asyncio.sleep(3600)
            elif self.probe_answer == "busy":  # the probe waits, another request is answered meanwhile
                await asyncio.sleep(0.05)
                self.last_answer = time.monotonic()
                await asyncio.sleep(3600)
            elif self.probe_answer is not None:
                raise self.probe_answer
        except asyncio.CancelledError:
            self.withdrawn += 1
            raise


def _app(manager=None, api_key=KEY, max_bytes=1 << 20, timeout=5.0):
    metrics = Metrics()
    info = ServerInfo("m", "m", 400, 100, "float32", "cpu", api_key=api_key, max_body_bytes=max_bytes,
                      body_read_timeout=timeout)
    return build_app(manager or StandIn(), info, metrics), metrics


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://flide")


def _count(metrics: Metrics, route: str, status: int) -> float:
    return metrics.registry.get_sample_value("flide_requests_total", {"route": route, "status": str(status)}) or 0.0


@pytest.fixture(scope="module")
def sglang_http():
    """SGLang 0.5.23's own HTTP server module: its app's routes and handlers are the reference."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.entrypoints import http_server as sglang_http_server
    return sglang_http_server


PATHS = ["/v1/decisions", "/v1/score", "/v1/systemone", "/flush_cache", "/health", "/health_generate", "/ready",
         "/metrics", "/v1/models", "/model_info", "/get_model_info", "/server_info", "/openapi.json", "/nowhere",
         "/healthz", "/readyz", "/metrics/extra"]
AUTHORIZATIONS = [None, "Bearer k", "bearer k", "BEARER k", "Bearer wrong", "Bearer K", "Basic k", "k", "Bearer  k",
                  "Bearer k ", "Bearerk"]


@pytest.mark.anyio
async def test_api_key_decisions_equal_sglangs(sglang_http):
    """For every method (OPTIONS included), path (guarded, probe, unknown) and
    Authorization variant, the server refuses (401, SGLang's body) exactly
    when SGLang 0.5.23's decide_request_auth does for that route of SGLang's app."""
    from sglang.srt.utils.auth import _get_auth_level_from_app_and_scope, decide_request_auth

    app, _ = _app()
    refused = allowed = 0
    async with _client(app) as client:
        for method in ("GET", "POST", "OPTIONS", "PUT"):
            for path in PATHS:
                scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
                level = _get_auth_level_from_app_and_scope(sglang_http.app, scope)
                for authorization in AUTHORIZATIONS:
                    want = decide_request_auth(method=method, path=path, authorization_header=authorization,
                                               api_key=KEY, admin_api_key=None, auth_level=level)
                    headers = {"Authorization": authorization} if authorization is not None else {}
                    r = await client.request(method, path, headers=headers)
                    case = (method, path, authorization, r.status_code)
                    if want.allowed:
                        allowed += 1
                        assert r.status_code != 401, case
                    else:
                        refused += 1
                        assert r.status_code == want.error_status_code == 401, case
                        assert r.json() == {"error": "Unauthorized"}, case
    assert refused > 100 and allowed > 100  # both sides of the table are exercised
    app, _ = _app(api_key=None)
    async with _client(app) as client:  # no --api-key: nothing is guarded
        assert (await client.get("/v1/models")).status_code == 200


CONTENT_TYPES = [None, "", "application/json", "APPLICATION/JSON", "application/json; charset=utf-8",
                 "Application/Json;charset=UTF-8", "application/json ; charset=utf-8", "text/plain",
                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonl",
                 "application/vnd.api+json", "text/json"]
BODIES = {"/v1/decisions": {"input": "x", "questions": [{"id": "a", "type": "choice", "question": "?",
                                                         "options": [{"name": "A"}, {"name": "B"}]}]},
          "/v1/score": {"query": "q", "items": ["a"], "label_token_ids": [1]},
          "/v1/systemone": {"state": "s", "model": "m", "questions": {"q": {"type": "noul", "instructions": "?"}}}}


def _sglang_reference(sglang_http):
    """The three routes as SGLang declares them: its body models, its
    validate_json_request dependency and its RequestValidationError handler."""
    from fastapi import Depends, FastAPI
    from fastapi.exceptions import RequestValidationError

    ref = FastAPI()
    ref.add_exception_handler(RequestValidationError, sglang_http.validation_exception_handler)
    json_only = [Depends(sglang_http.validate_json_request)]

    @ref.post("/v1/decisions", dependencies=json_only)
    async def decisions(request: DecisionRequest):
        return {"ok": True}

    @ref.post("/v1/score", dependencies=json_only)
    async def score(request: ScoringRequest):
        return {"ok": True}

    @ref.post("/v1/systemone", dependencies=json_only)
    async def systemone(request: SystemOneRequest):
        return {"ok": True}

    return ref


@pytest.mark.anyio
async def test_content_types_are_answered_as_sglang_answers_them(sglang_http):
    import orjson

    app, _ = _app(api_key=None)
    ref = _sglang_reference(sglang_http)
    refusals = 0
    async with _client(app) as flide, _client(ref) as sglang:
        for path, body in BODIES.items():
            for content_type in CONTENT_TYPES:
                headers = {"Content-Type": content_type} if content_type is not None else {}
                args = dict(content=orjson.dumps(body), headers=headers)
                got, want = await flide.post(path, **args), await sglang.post(path, **args)
                case = (path, content_type)
                assert got.status_code == want.status_code, (case, got.text, want.text)
                assert got.headers["x-request-id"]
                if want.status_code != 200:
                    refusals += 1
                    answer = got.json()
                    assert answer.pop("rid") == got.headers["x-request-id"]
                    assert answer == want.json(), case
            # No Content-Type and a body that is not JSON: both refuse it, each
            # naming its own reason (SGLang's JSON parser runs first there).
            got, want = await flide.post(path, content=b"{oops"), await sglang.post(path, content=b"{oops")
            assert got.status_code == want.status_code and got.status_code in (400, 422)
    assert refusals >= 3 * 8


@pytest.mark.anyio
async def test_request_ids_are_echoed_and_in_error_bodies():
    async def fail(body):
        if body.get("boom"):
            raise RuntimeError("broken route")
        raise RequestError("input", "is wrong")

    app, metrics = _app(StandIn(fail), max_bytes=100)
    async with _client(app) as client:
        ok = await client.get("/health", headers={"X-Request-Id": "probe-1"})
        assert ok.headers["x-request-id"] == "probe-1"
        auth = {"Authorization": "Bearer k", "Content-Type": "application/json"}
        bad = await client.post("/v1/score", content=b"{}", headers={**auth, "X-Request-Id": "req-42"})
        assert bad.status_code == 400 and bad.headers["x-request-id"] == "req-42"
        assert bad.json()["rid"] == "req-42" and bad.json()["param"] == "input"
        big = await client.post("/v1/score", content=b"x" * 101, headers={**auth, "X-Request-Id": "req-43"})
        assert big.status_code == 413 and big.json()["rid"] == "req-43"
        unauthorised = await client.post("/v1/score", headers={"X-Request-Id": "req-44"})
        assert unauthorised.status_code == 401 and unauthorised.headers["x-request-id"] == "req-44"
        # A failing route's 500 comes from Starlette's outermost error middleware; it carries the id too.
        boom = await client.post("/v1/score", content=b'{"boom": 1}', headers={**auth, "X-Request-Id": "req-45"})
        assert boom.status_code == 500 and boom.headers["x-request-id"] == "req-45"
        made = set()
        for odd in ("two words", "x" * 129, "caf\u00e9", ""):
            r = await client.get("/health", headers={"X-Request-Id": odd.encode("utf-8")})
            assert re.fullmatch("[0-9a-f]{32}", r.headers["x-request-id"]), odd
            made.add(r.headers["x-request-id"])
        assert len(made) == 4
        assert re.fullmatch("[0-9a-f]{32}", (await client.get("/health")).headers["x-request-id"])
    assert _count(metrics, "/v1/score", 500) == 1 and _count(metrics, "/v1/score", 413) == 1


def test_log_lines_end_with_the_request_id():
    """uvicorn's access line and the lines logged inside a request end with its
    id; lines outside a request are left alone."""
    import contextvars
    import logging

    from flide_ext.server.request_ids import RID, uvicorn_log_config

    config = uvicorn_log_config()
    formatters = {}
    for name in ("access", "default"):
        spec = dict(config["formatters"][name])
        factory = spec.pop("()")
        module, _, cls = factory.rpartition(".")
        formatters[name] = getattr(__import__(module, fromlist=[cls]), cls)(**spec)
    rid_filter = config["filters"]["rid"]["()"]()

    def line(kind, msg, args):
        record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, msg, args, None)
        rid_filter.filter(record)
        return formatters[kind].format(record)

    access = ('%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5", "POST", "/v1/score", "1.1", 400))
    context = contextvars.copy_context()
    context.run(RID.set, "req-7")
    assert context.run(line, "access", *access).endswith('"POST /v1/score HTTP/1.1" 400 Bad Request rid=req-7')
    assert context.run(line, "default", "health check failed", ()).endswith("health check failed rid=req-7")
    assert line("default", "Application startup complete.", ()).endswith("Application startup complete.")


@pytest.mark.anyio
async def test_routes_are_labelled_by_template_and_unknown_paths_share_one():
    """20,000 random paths leave one ``unmatched`` series: /metrics stays small."""
    app, metrics = _app(api_key=None)
    async with _client(app) as client:
        assert (await client.get("/v1/models")).status_code == 200
        assert (await client.get("/v1/decisions")).status_code == 405  # the path's route, not its method's
    assert _count(metrics, "/v1/models", 200) == 1 and _count(metrics, "/v1/decisions", 405) == 1
    rng = random.Random(0)
    paths = ["/" + "/".join(f"{rng.getrandbits(40):x}" for _ in range(rng.randint(1, 4))) for _ in range(20_000)]
    statuses = set()
    for path in paths:  # plain ASGI calls: the app's own cost, not a client's
        statuses.add(await _asgi_status(app, path))
    assert statuses == {404}
    assert _count(metrics, "unmatched", 404) == 20_000
    text = metrics.render()
    assert len(text) < 100_000, len(text)
    assert not any(path.encode() in text for path in paths[:200])


async def _asgi_status(app, path: str) -> int:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": [],
             "client": ("127.0.0.1", 1), "server": ("flide", 80)}
    await app(scope, receive, send)
    return sent[0]["status"]


async def _call(app, chunks, headers, delay=0.0):
    """POST /v1/score with ``chunks`` as the body's messages (the first after
    ``delay`` seconds; a None chunk never arrives). -> (status, body, events)
    where events lists "recv" and "start" in the order they happened."""
    events, sent = [], []
    pending = list(chunks)

    async def receive():
        if not pending:
            return {"type": "http.disconnect"}
        if delay and "recv" not in events:
            await asyncio.sleep(delay)
        chunk = pending.pop(0)
        if chunk is None:
            await asyncio.sleep(3600)
        events.append("recv")
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message):
        if message["type"] == "http.response.start":
            events.append("start")
        sent.append(message)

    raw = [(b"content-type", b"application/json"), *headers]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/score", "raw_path": b"/v1/score", "root_path": "", "query_string": b"", "headers": raw,
             "client": ("127.0.0.1", 1), "server": ("flide", 80)}
    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start, body, events


@pytest.mark.anyio
async def test_bodies_over_the_limit_are_refused_before_they_are_read(monkeypatch):
    import orjson

    monkeypatch.setattr(body_limits, "LINGER_S", 0.2)
    manager = StandIn()
    app, metrics = _app(manager, api_key=None, max_bytes=10 * 1024)
    chunk = b" " * 1024
    # Declared too large: answered before a byte of the body is received.
    start, body, events = await _call(app, [chunk] * 50, [(b"content-length", b"51200")])
    assert start["status"] == 413 and events[0] == "start"
    assert (b"connection", b"close") in start["headers"]
    answer = orjson.loads(body)
    assert answer["param"] == "body" and "10240 bytes" in answer["message"] and "--max-body-mb" in answer["message"]
    # Chunked: reading stops at the chunk that passes the limit.
    start, body, events = await _call(app, [chunk] * 50, [])
    assert start["status"] == 413 and events.index("start") == 11
    assert manager.calls == 0
    # A client that stops sending: its connection lingers LINGER_S after the
    # answer, which its latency does not count.
    monkeypatch.setattr(body_limits, "LINGER_S", 0.5)
    start, body, events = await _call(app, [chunk] * 12 + [None], [])
    assert start["status"] == 413 and events.count("recv") == 12
    seconds = metrics.registry.get_sample_value("flide_request_latency_seconds_sum", {"route": "/v1/score"})
    assert seconds < 0.5
    # At the limit: read whole and answered.
    start, body, _ = await _call(app, [b"{}" + b" " * (10 * 1024 - 2)], [(b"content-length", b"10240")])
    assert start["status"] == 200 and manager.calls == 1
    assert _count(metrics, "/v1/score", 413) == 3


@pytest.mark.anyio
async def test_a_body_too_slow_to_arrive_is_408(monkeypatch):
    import orjson

    monkeypatch.setattr(body_limits, "LINGER_S", 0.2)
    manager = StandIn()
    app, metrics = _app(manager, api_key=None, timeout=0.3)
    start, body, events = await _call(app, [b"{", None], [(b"content-length", b"2")])
    assert start["status"] == 408 and (b"connection", b"close") in start["headers"]
    answer = orjson.loads(body)
    assert answer["param"] == "body" and "0.3 s" in answer["message"] and manager.calls == 0
    # A body that arrives in time, after a pause shorter than the limit, is answered,
    # and its latency counts from its arrival at the app, the wait for the body included.
    start, _, _ = await _call(app, [b"{}"], [], delay=0.2)
    assert start["status"] == 200 and manager.calls == 1
    seconds = metrics.registry.get_sample_value("flide_request_latency_seconds_sum", {"route": "/v1/score"})
    assert seconds >= 0.2 + 0.3  # the 408 (after 0.3 s) and the late body (0.2 s)


@pytest.mark.anyio
async def test_probes(monkeypatch):
    """/health, /ready and /health_generate: 200 while the scheduler can answer;
    /health_generate goes through the scheduler (503 when its probe fails or
    does not come back in time); all three 503 once ``scheduler_error`` is set."""
    monkeypatch.setattr(http_server, "HEALTH_CHECK_TIMEOUT", 0.2)
    manager = StandIn()
    app, _ = _app(manager)
    async with _client(app) as client:
        for path in ("/health", "/ready", "/health_generate"):
            assert (await client.get(path)).status_code == 200, path
        assert manager.probes == 1
        for answer in (RuntimeError("no scheduler"), "hang"):
            manager.probe_answer = answer
            assert (await client.get("/health_generate")).status_code == 503
            assert (await client.get("/health")).status_code == 200  # the flag is not set by a probe
        # A busy scheduler: the probe still waits when another answer comes, which
        # counts (as SGLang counts it), and the probe is withdrawn.
        manager.probe_answer, withdrawn = "busy", manager.withdrawn
        assert (await client.get("/health_generate")).status_code == 200
        assert manager.withdrawn == withdrawn + 1
        manager.probe_answer = None
        manager.scheduler_error = "the scheduler process exited"
        for path in ("/health", "/ready", "/health_generate"):
            assert (await client.get(path)).status_code == 503, path
        assert manager.probes == 4  # the last probe was not tried


@pytest.fixture
def anyio_backend():
    return "asyncio"
