"""Error answers of the HTTP server, in SGLang's formats.

Every error body Flide writes is SGLang's ``ErrorResponse`` (``object``,
``message``, ``type``, ``param``, ``code``) plus ``rid``, the request's id
(:mod:`.request_ids`); SGLang's own API-key middleware answers 401 with its
own body. Content types are enforced as SGLang enforces them on the decision
routes: anything but ``application/json`` is a ``RequestValidationError``,
answered as SGLang's handler answers it (400 in ``ErrorResponse`` with the
error list in the message; on ``/v1/systemone`` 422 with FastAPI's detail list,
which the System One API documents).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Optional

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .request_ids import RID

# SGLang's wording for a body that is not JSON (its validate_json_request).
NOT_JSON = "Unsupported Media Type: Only 'application/json' is allowed"


def error_body(status: int, message: str, param: Optional[str] = None, kind: str = "BadRequestError") -> dict:
    """SGLang's ``ErrorResponse`` as a dict, with the running request's ``rid``."""
    from sglang.srt.entrypoints.openai.protocol import ErrorResponse

    body = ErrorResponse(message=message, type=kind, param=param, code=status).model_dump()
    body["rid"] = RID.get()
    return body


def error_response(status: int, message: str, param: Optional[str] = None, kind: str = "BadRequestError",
                   close: bool = False) -> JSONResponse:
    """:func:`error_body` as a response; ``close`` ends the connection after it
    (the rest of the request's body is not read)."""
    headers = {"connection": "close"} if close else None
    return JSONResponse(status_code=status, content=error_body(status, message, param, kind), headers=headers)


async def require_json(request: Request) -> None:
    """FastAPI dependency: the request's media type must be ``application/json``
    (compared as SGLang compares it: lower-cased, parameters cut off).

    Raises:
        RequestValidationError: at ``["header", "content-type"]``.
    """
    media_type = request.headers.get("content-type", "").lower().split(";", 1)[0]
    if media_type != "application/json":
        raise RequestValidationError(
            errors=[{"loc": ["header", "content-type"], "msg": NOT_JSON, "type": "value_error"}]
        )


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """Exception handler: a ``RequestValidationError`` answered in SGLang's format
    for the route (see the module's docstring)."""
    path = request.url.path.removeprefix(request.scope.get("root_path", ""))
    if path == "/v1/systemone":
        detail = [{key: value for key, value in error.items() if key != "input"} for error in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": jsonable_encoder(detail), "rid": RID.get()})
    text, listed = str(exc), str(exc.errors())
    message = f"{text} {listed}" if listed and listed != text else text
    return error_response(400, message, kind=HTTPStatus.BAD_REQUEST.phrase)


def route_errors(served: list[str]):
    """An exception handler for Starlette's ``HTTPException``: an unknown route
    (404) or method (405) answered in SGLang's ``ErrorResponse``, naming what
    decision mode serves (``served``: ``"POST /v1/score"``, ...); any other
    status with its detail as the message."""
    listing = ", ".join(served)

    async def handler(request: Request, exc: HTTPException) -> JSONResponse:
        path = request.url.path
        if exc.status_code == 404:
            return error_response(404, f"{request.method} {path} is not served in decision mode; it serves {listing}",
                                  kind="NotFoundError")
        if exc.status_code == 405:
            allowed = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "")
            response = error_response(405, f"{path} takes {allowed or 'other methods'}, not {request.method}",
                                      kind="MethodNotAllowedError")
            if allowed:
                response.headers["allow"] = allowed
            return response
        try:
            kind = HTTPStatus(exc.status_code).phrase
        except ValueError:  # a status the standard library does not name
            kind = "Error"
        return error_response(exc.status_code, str(exc.detail), kind=kind)

    return handler
