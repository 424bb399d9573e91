"""The HTTP server: SGLang's decision routes, answered by Flide's forked executor.

Routes (same wire format as SGLang, its own pydantic models): ``POST
/v1/decisions``, ``POST /v1/systemone``, ``POST /v1/score``; ``GET|POST /flush_cache``;
``GET /health``, ``/model_info``, ``/get_model_info``, ``/server_info``, ``/v1/models``,
``/metrics``. Bad input is answered 400 with SGLang's ``ErrorResponse`` whose
``param`` names the field;
``--api-key`` requires ``Authorization: Bearer <key>`` (401 otherwise). A
scheduler that failed, a stopping server or a full queue is answered 503, a
request past ``--request-timeout`` 504; a request whose client went away is
withdrawn (:mod:`.cancellation`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import orjson
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers

from sglang.srt.entrypoints.systemone.protocol import SystemOneResponse

from ..protocol.errors import RequestError
from ..version import __version__
from .cancellation import ClientDisconnected, RequestTimedOut, while_client_waits
from .metrics import Metrics, RequestClock
from .tokenizer_manager import CLOCK, SchedulerError, SchedulerUnavailable, TokenizerManager


@dataclass
class ServerInfo:
    model_path: str
    served_model_name: str
    context_length: int
    vocab_size: int
    dtype: str
    device: str
    api_key: Optional[str] = None
    disable_radix_cache: bool = False
    state_cache_bytes: int = 0  # the cache's budget (0: off)
    state_cache_max_tokens: int = 0


def _error(status: int, message: str, param: Optional[str] = None, kind: str = "BadRequestError"):
    from sglang.srt.entrypoints.openai.protocol import ErrorResponse

    body = ErrorResponse(message=message, type=kind, param=param, code=status)
    return JSONResponse(status_code=status, content=body.model_dump())


# Routes answered without the API key (probes, scrapers, the schema).
OPEN_PATHS = ("/health", "/metrics", "/docs", "/openapi.json")


class ApiKeyAndMetrics:
    """Plain ASGI middleware: refuses a request without ``Authorization: Bearer
    <api_key>`` (401, SGLang's error body naming ``authorization``) outside
    :data:`OPEN_PATHS`, and observes every HTTP request's route, status and
    seconds in ``metrics``. Plain ASGI rather than ``@app.middleware("http")``,
    whose wrapper runs each request through an extra task and body stream."""

    def __init__(self, app, api_key: Optional[str], metrics: Metrics):
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, path = time.perf_counter(), scope["path"]
        if self.api_key and path not in OPEN_PATHS:
            if Headers(scope=scope).get("authorization", "") != f"Bearer {self.api_key}":
                response = _error(401, "a valid API key is required (Authorization: Bearer <key>)", "authorization",
                                  "AuthenticationError")
                await response(scope, receive, send)
                self.metrics.observe(path, 401, time.perf_counter() - start)
                return
        status = 500  # what an app that fails before it answers is counted as

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.observe(path, status, time.perf_counter() - start)


def build_app(manager: TokenizerManager, info: ServerInfo, metrics: Metrics) -> FastAPI:
    """The FastAPI application over a running tokenizer manager."""
    app = FastAPI(title="Flide", description="Exact forked decision inference for SGLang's decision routes.")

    app.add_middleware(ApiKeyAndMetrics, api_key=info.api_key, metrics=metrics)

    async def body_of(request: Request):
        raw = await request.body()
        try:
            return orjson.loads(raw)  # SGLang's own parser: long id lists parse faster than with json
        except orjson.JSONDecodeError as e:
            raise RequestError("body", f"is not valid JSON: {e}") from None

    async def answer(request: Request, handler):
        clock = RequestClock()
        CLOCK.set(clock)  # this request's task only
        try:
            body = await body_of(request)
            result = await while_client_waits(request.receive, handler(body), manager.request_timeout)
        except RequestError as e:
            return _error(400, e.message, e.field)
        except SchedulerError as e:
            return _error(500, str(e), None, "InternalServerError")
        except SchedulerUnavailable as e:
            return _error(503, str(e), None, "ServiceUnavailableError")
        except RequestTimedOut as e:
            return _error(504, str(e), None, "TimeoutError")
        except ClientDisconnected:  # no one reads it; SGLang answers an abandoned request 400 too
            return _error(400, "the client disconnected; the request was withdrawn")
        exclude_none = not isinstance(result, SystemOneResponse)  # System One keeps its nulls
        response = JSONResponse(content=result.model_dump(exclude_none=exclude_none))
        clock.lap("respond")
        metrics.stages(clock)
        return response

    @app.post("/v1/decisions")
    async def decisions(request: Request):
        """SGLang ``DecisionRequest`` -> ``DecisionResponse``."""
        manager.start()
        return await answer(request, manager.decide)

    @app.post("/v1/systemone")
    async def systemone(request: Request):
        """System One API 0.2.0 ``SystemOneRequest`` -> ``SystemOneResponse``."""
        manager.start()
        return await answer(request, manager.decide_systemone)

    @app.post("/v1/score")
    async def score(request: Request):
        """SGLang ``ScoringRequest`` -> ``ScoringResponse`` (delimiter-free)."""
        manager.start()
        return await answer(request, manager.score_request)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(timeout: float = Query(0.0, ge=0.0)):
        """Empty the state cache (SGLang's route and answer). Flide flushes at the
        next gap between rounds, so it never refuses for running requests and
        ``timeout`` (SGLang's wait for an idle server) has nothing to wait for."""
        manager.start()
        try:
            done = await manager.flush_cache()
        except SchedulerUnavailable as e:
            return _error(503, str(e), None, "ServiceUnavailableError")
        if done.error:
            return Response(content=f"Flush cache failed: {done.error}\n", status_code=400)
        return Response(content="Cache flushed.\n", status_code=200)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if manager.scheduler_error is None else 503)

    def model_info():
        return {
            "model_path": info.model_path,
            "tokenizer_path": info.model_path,
            "is_generation": True,
            "served_model_name": info.served_model_name,
            "context_length": info.context_length,
            "decision_mode": True,
        }

    app.get("/model_info")(model_info)
    app.get("/get_model_info")(model_info)

    @app.get("/server_info")
    async def server_info():
        return {"decision_mode": True, "model_path": info.model_path, "dtype": info.dtype, "device": info.device,
                "context_length": info.context_length, "vocab_size": info.vocab_size,
                "disable_radix_cache": info.disable_radix_cache, "state_cache_bytes": info.state_cache_bytes,
                "state_cache_max_tokens": info.state_cache_max_tokens}

    @app.get("/v1/models")
    async def models():
        from sglang.srt.entrypoints.openai.protocol import ModelCard, ModelList

        card = ModelCard(id=info.served_model_name, root=info.model_path, max_model_len=info.context_length,
                         owned_by="flide")
        return JSONResponse(content=ModelList(data=[card]).model_dump())

    @app.get("/metrics")
    async def prometheus():
        return Response(content=metrics.render(), media_type="text/plain; version=0.0.4")

    _document_bodies(app)
    return app


def _document_bodies(app: FastAPI) -> None:
    """Put SGLang's request models into the OpenAPI schema as the routes' bodies.

    The routes read raw JSON themselves (to answer bad input with SGLang's error
    object naming the field), so FastAPI cannot see their body models; clients
    and schema-driven testers (schemathesis) get them from here.
    """
    from sglang.srt.entrypoints.openai.protocol import DecisionRequest, ScoringRequest
    from sglang.srt.entrypoints.systemone.protocol import SystemOneRequest

    def openapi():
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=__version__, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            bodies = (("/v1/decisions", DecisionRequest), ("/v1/systemone", SystemOneRequest), ("/v1/score", ScoringRequest))
            for path, model in bodies:
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
                schema["paths"][path]["post"]["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
                }
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
