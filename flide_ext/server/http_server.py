"""The HTTP server: SGLang's decision routes, answered by Flide's forked executor.

Routes (same wire format as SGLang, its own pydantic models): ``POST
/v1/decisions``, ``POST /v1/systemone``, ``POST /v1/score``; ``GET|POST /flush_cache``;
``GET /health``, ``/health_generate``, ``/ready``, ``/model_info``,
``/get_model_info``, ``/server_info``, ``/v1/models``, ``/metrics``.

SGLang's manners: bad input is answered 400 with SGLang's ``ErrorResponse``
whose ``param`` names the field; the decision routes take ``application/json``
only (:mod:`.http_errors`); ``--api-key`` is checked by SGLang's own
middleware (``sglang.srt.utils.auth``: every route but the probes and
``/metrics``, any case of ``Bearer``, constant-time, OPTIONS open; 401
``{"error": "Unauthorized"}``). Every response carries ``X-Request-Id``
(:mod:`.request_ids`); bodies are limited in size and time
(:class:`~.body_limits.BodyLimits`). A scheduler that failed, a stopping server
or a full queue is answered 503, a request past ``--request-timeout`` 504; a
request whose client went away is withdrawn (:mod:`.cancellation`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import warnings
from dataclasses import dataclass
from typing import Optional

import orjson
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from sglang.srt.entrypoints.systemone.protocol import SystemOneResponse
from sglang.srt.utils.auth import AuthLevel, add_api_key_middleware, auth_level

from ..protocol.errors import RequestError
from ..version import __version__
from .body_limits import BODY_READ_TIMEOUT_S, MAX_BODY_MB, BodyLimits, body_limits
from .cancellation import ClientDisconnected, RequestTimedOut, while_client_waits
from .http_errors import error_response, require_json, route_errors, validation_error
from .http_middleware import ObservedApp
from .metrics import Metrics, RequestClock
from .request_ids import RID
from .tokenizer_manager import BODY_BYTES, CLOCK, SchedulerError, SchedulerUnavailable, TokenizerManager

logger = logging.getLogger(__name__)
# SGLang's API-key middleware and System One handler answer with ORJSONResponse,
# which FastAPI 0.165 deprecates; the warning is about SGLang's code, not a request.
warnings.filterwarnings("ignore", message="ORJSONResponse is deprecated")
# Seconds /health_generate waits for the scheduler's answer (SGLang's variable and default).
HEALTH_CHECK_TIMEOUT = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", 20))


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
    max_body_bytes: int = body_limits(MAX_BODY_MB, BODY_READ_TIMEOUT_S)[0]
    body_read_timeout: float = BODY_READ_TIMEOUT_S  # seconds
    deterministic: bool = False  # --enable-deterministic-inference
    residual_dtype: str = ""  # the residual stream's dtype in use (--residual-dtype)


def build_app(manager: TokenizerManager, info: ServerInfo, metrics: Metrics) -> FastAPI:
    """The FastAPI application over a running tokenizer manager."""
    app = ObservedApp(metrics, title="Flide",
                      description="Exact forked decision inference for SGLang's decision routes.")
    app.add_exception_handler(RequestValidationError, validation_error)
    # Added first, so it runs inside the body limits: a body too large is refused
    # whatever its key, before it is read.
    if info.api_key:
        add_api_key_middleware(app, api_key=info.api_key, admin_api_key=None)
    app.add_middleware(BodyLimits, max_bytes=info.max_body_bytes, timeout=info.body_read_timeout)

    async def body_of(request: Request):
        try:
            raw = await request.body()
        except ClientDisconnect:  # it left before its body had all come: as one that leaves while it waits
            raise ClientDisconnected() from None
        BODY_BYTES.set(len(raw))
        try:
            return orjson.loads(raw)  # SGLang's own parser: long id lists parse faster than with json
        except orjson.JSONDecodeError as e:
            raise RequestError("body", f"is not valid JSON: {e}") from None

    async def answer(request: Request, handler):
        clock = RequestClock()
        CLOCK.set(clock)  # this request's task only
        # Checked here rather than as a FastAPI dependency, whose resolution
        # costs a request more than the check; refused the same way (422/400).
        await require_json(request)
        try:
            body = await body_of(request)
            result = await while_client_waits(request.receive, handler(body), manager.request_timeout)
        except RequestError as e:
            return error_response(400, e.message, e.field)
        except SchedulerError as e:
            logger.error("%s %s failed: %s rid=%s", request.method, request.url.path, e, RID.get())
            return error_response(500, str(e), None, "InternalServerError")
        except SchedulerUnavailable as e:
            return error_response(503, str(e), None, "ServiceUnavailableError")
        except RequestTimedOut as e:
            return error_response(504, str(e), None, "TimeoutError")
        except ClientDisconnected:  # no one reads it; SGLang answers an abandoned request 400 too
            return error_response(400, "the client disconnected; the request was withdrawn")
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
    @auth_level(AuthLevel.ADMIN_OPTIONAL)  # as SGLang marks it (the API key guards it here)
    async def flush_cache(timeout: float = Query(0.0, ge=0.0)):
        """Empty the state cache (SGLang's route and answer). Flide flushes at the
        next gap between rounds, so it never refuses for running requests and
        ``timeout`` (SGLang's wait for an idle server) has nothing to wait for."""
        manager.start()
        try:
            done = await manager.flush_cache()
        except SchedulerUnavailable as e:
            return error_response(503, str(e), None, "ServiceUnavailableError")
        if done.error:
            return Response(content=f"Flush cache failed: {done.error}\n", status_code=400)
        return Response(content="Cache flushed.\n", status_code=200)

    def up() -> Response:
        return Response(status_code=200 if manager.scheduler_error is None else 503)

    @app.get("/health")
    async def health():
        """200 while the scheduler can answer, else 503."""
        return up()

    @app.get("/ready")
    async def ready():
        """Whether the server takes new requests (SGLang's): 200 while the
        scheduler can answer, else 503."""
        return up()

    @app.get("/health_generate")
    async def health_generate():
        """SGLang's probe through the model: a one-token prompt through the
        scheduler's next round; healthy once the scheduler answers it, or any
        request, after the probe started (as SGLang counts a busy server's
        answers), and then the probe is withdrawn if it still waits; 503 when the
        scheduler cannot answer or nothing came within
        ``SGLANG_HEALTH_CHECK_TIMEOUT`` seconds (20)."""
        if manager.scheduler_error is None:
            started = time.monotonic()
            probe = asyncio.ensure_future(manager.probe())
            try:
                while not probe.done() and manager.last_answer <= started:
                    left = started + HEALTH_CHECK_TIMEOUT - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"no answer from the scheduler within {HEALTH_CHECK_TIMEOUT:g} s")
                    await asyncio.wait({probe}, timeout=min(left, 0.05))
                if probe.done():
                    probe.result()  # its failure is the probe's answer
            except Exception as e:  # noqa: BLE001 - any failure to answer is the probe's answer
                logger.error("health check failed: %s: %s rid=%s", type(e).__name__, e, RID.get())
                return Response(status_code=503)
            finally:
                probe.cancel()  # withdrawn from the scheduler if it still waits
        return up()

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
                "state_cache_max_tokens": info.state_cache_max_tokens,
                "enable_deterministic_inference": info.deterministic, "residual_dtype": info.residual_dtype}

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
    served = [f"{'/'.join(sorted(route.methods - {'HEAD'}))} {route.path}" for route in app.routes
              if isinstance(route, APIRoute)]
    app.add_exception_handler(StarletteHTTPException, route_errors(served))
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
