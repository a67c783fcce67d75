"""The HTTP edge of ``errors.py``: every error, the framework's own included, answers in the shape of the API it
was asked through: OpenAI's everywhere, Anthropic's on the Messages routes (``/v1/messages...``:
``{"type": "error", "error": {"type", "message"}}``), the Tinker SDK's on its routes (``/api/v1/...``:
``{"error": message}``); bodies over the limit get a 413 (``BodySizeLimit``)."""

from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from agentjet.server.errors import APIError, error_body

log = logging.getLogger(__name__)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for err in exc.errors()[:5]:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where = ".".join(loc)
        param = param or where or None
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "; ".join(parts) or "invalid request", param


ANTHROPIC_PREFIX = "/v1/messages"  # the Anthropic Messages routes answer errors in Anthropic's shape
TINKER_PREFIX = "/api/v1/"  # the Tinker SDK's routes answer errors in its shape (it shows ``error``)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 503: "overloaded_error"}


def anthropic_error_body(message: str, status: int) -> dict[str, Any]:
    """Anthropic's error shape; the type follows the status as Anthropic's does (a 409 or a 422 is a request
    error, a 5xx other than 503 an ``api_error``)."""
    type_ = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": type_, "message": message}}


def tinker_error_body(message: str) -> dict[str, Any]:
    """The Tinker SDK's error shape: the message as ``error`` (what it shows) and as ``detail``."""
    return {"error": message, "detail": message}


def shaped_error(path: str, status: int, message: str, type_: str, param: str | None = None,
                 code: str | None = None) -> dict[str, Any]:
    """An error's body in the shape of the API at ``path``."""
    if path.startswith(ANTHROPIC_PREFIX):
        return anthropic_error_body(message, status)
    if path.startswith(TINKER_PREFIX):
        return tinker_error_body(message)
    return error_body(message, type_, param, code)


def install_error_handlers(app: FastAPI) -> None:
    def answer(request: Request, status: int, message: str, type_: str, param: str | None = None,
               code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(shaped_error(request.url.path, status, message, type_, param, code), status,
                            headers=headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return answer(request, exc.status, exc.message, exc.type, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return answer(request, 400, message, "invalid_request_error", param, "invalid_request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        if exc.status_code == 413:
            return answer(request, 413, str(exc.detail), type_, code="body_too_large")
        message = str(exc.detail)
        if exc.status_code in (404, 405):  # the router's own: say which route was asked for
            message = f"{message}: no route {request.method} {request.url.path!r} on this server"
        return answer(request, exc.status_code, message, type_)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected server error")
        return answer(request, 500, f"internal error: {type(exc).__name__}", "server_error")


class BodySizeLimit:
    """Bodies over ``max_bytes`` get a 413 in OpenAI's shape: when Content-Length declares it, after the body
    has been read and discarded (a client still sending would otherwise see its connection reset instead of
    the answer), up to ``DRAIN_LIMIT`` bytes; or as soon as a chunked body crosses the limit while it is read."""

    DRAIN_LIMIT = 256 * 1024 * 1024

    def __init__(self, app: ASGIApp, max_bytes: int, wider: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.wider = wider or {}  # path prefix -> its own (larger) limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            limit = next((n for prefix, n in self.wider.items() if path.startswith(prefix)), self.max_bytes)
            if limit != self.max_bytes:
                await BodySizeLimit(self.app, limit)(scope, receive, send)
                return
            declared = dict(scope["headers"]).get(b"content-length", b"")
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._drain(receive, int(declared))
                body = json.dumps(shaped_error(path, 413, f"request body of {int(declared)} bytes exceeds the "
                                               f"limit of {self.max_bytes} bytes", "invalid_request_error",
                                               code="body_too_large")).encode()
                await send({"type": "http.response.start", "status": 413,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
            receive = self._counting(receive)
        await self.app(scope, receive, send)

    async def _drain(self, receive: Receive, declared: int) -> None:
        if declared > self.DRAIN_LIMIT:
            return  # not worth reading: answer at once and close
        seen = 0
        while seen <= declared:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    def _counting(self, receive: Receive) -> Receive:
        seen = 0

        async def wrapped() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise StarletteHTTPException(413, f"request body exceeds the limit of {self.max_bytes} bytes")
            return message

        return wrapped
