"""Errors in the OpenAI shape, mapped by exception type (never by message text).

``{"error": {"message", "type", "param", "code"}}`` with the status of the exception's
``http_status``; ``type`` is its ``error_type``; ``code`` comes from :data:`ERROR_CODES` by class.
A context overflow (``type`` ``exceed_context_size_error``, as llama-server) adds its token
counts (:meth:`~llamapy.errors.ContextOverflowError.overflow_detail`), llama-server's
``n_prompt_tokens`` and ``n_ctx`` among them; a full queue answers 429
with ``Retry-After``. Any other exception is a 500 with the same shape, and the server keeps
serving.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from ..errors import (
    AuthenticationError,
    ContextOverflowError,
    EndpointDisabledError,
    GrammarError,
    HostNotAllowedError,
    LlamapyError,
    ModelNotFoundError,
    OriginNotAllowedError,
    PayloadTooLargeError,
    PermissionDeniedError,
    QueueFullError,
    ReplicaUnavailableError,
    RouteNotFoundError,
    SlotFileBudgetError,
    StoredObjectNotFoundError,
    TemplateError,
    UnknownOptionError,
    UnsupportedFeatureError,
    UnsupportedMediaTypeError,
)

log = logging.getLogger("llamapy.serve")

#: OpenAI-style ``code`` by error class (the most specific class listed wins).
ERROR_CODES: dict[type[LlamapyError], str] = {
    ContextOverflowError: "context_length_exceeded",
    ModelNotFoundError: "model_not_found",
    QueueFullError: "rate_limit_exceeded",
    AuthenticationError: "invalid_api_key",
    PermissionDeniedError: "permission_denied",
    SlotFileBudgetError: "slot_file_budget_exceeded",
    UnknownOptionError: "unknown_parameter",
    UnsupportedFeatureError: "unsupported_feature",
    GrammarError: "invalid_grammar",
    TemplateError: "chat_template_error",
    PayloadTooLargeError: "payload_too_large",
    RouteNotFoundError: "not_found",
    EndpointDisabledError: "endpoint_disabled",
    ReplicaUnavailableError: "replica_unavailable",
    UnsupportedMediaTypeError: "unsupported_media_type",
    HostNotAllowedError: "host_not_allowed",
    OriginNotAllowedError: "origin_not_allowed",
}

#: Seconds a client should wait after a 429 before retrying.
RETRY_AFTER_S = 1


def error_code(exc: LlamapyError) -> str | None:
    """The ``code`` for an error: its own (a stored object's), else the entry of its nearest
    class in :data:`ERROR_CODES`."""
    if isinstance(exc, StoredObjectNotFoundError):
        return exc.code
    for cls in type(exc).__mro__:
        if cls in ERROR_CODES:
            return ERROR_CODES[cls]  # type: ignore[index]
    return None


def error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` for any exception."""
    if not isinstance(exc, LlamapyError):
        return 500, {"error": {"message": f"internal error: {type(exc).__name__}: {exc}",
                               "type": "server_error", "param": None, "code": None}}
    error: dict[str, Any] = {"message": str(exc), "type": exc.error_type,
                             "param": getattr(exc, "option", None), "code": error_code(exc)}
    if isinstance(exc, ContextOverflowError):
        error.update(exc.overflow_detail().as_dict())
    if isinstance(exc, UnsupportedFeatureError) and error["param"] is None:
        error["param"] = exc.feature
    return exc.http_status, {"error": error}


def error_headers(exc: BaseException) -> dict[str, str]:
    """Extra response headers for an error (``Retry-After`` on a full queue or a lost
    replica)."""
    if isinstance(exc, (QueueFullError, ReplicaUnavailableError)):
        return {"Retry-After": str(RETRY_AFTER_S)}
    if isinstance(exc, AuthenticationError):
        return {"WWW-Authenticate": "Bearer"}
    return {}


def error_response(exc: BaseException) -> JSONResponse:
    """The JSON response for an exception."""
    status, body = error_body(exc)
    return JSONResponse(body, status_code=status, headers=error_headers(exc))


#: The WebSocket close code of a refused handshake where the server sends no denial response.
WS_POLICY_VIOLATION = 1008


async def refuse_websocket(websocket: WebSocket, exc: BaseException) -> None:
    """Refuse a WebSocket handshake with the error's JSON response (a denial response, where
    the server sends them: the client sees the status), else close it with 1008."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(error_response(exc))
    else:
        await websocket.close(WS_POLICY_VIOLATION, str(exc)[:120])


async def _llamapy_handler(request: Request, exc: Exception) -> JSONResponse:
    return error_response(exc)


async def _http_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code in (404, 405):
        error: LlamapyError = RouteNotFoundError(
            f"no endpoint {request.method} {request.url.path}")
        error.http_status = exc.status_code
        shape = getattr(request.app.state, "error_shape", None)  # the route's own, if any
        return shape(request, error) if shape is not None else error_response(error)
    _, body = error_body(LlamapyError(str(exc.detail)))
    return JSONResponse(body, status_code=exc.status_code)


def install_error_handlers(app: Starlette) -> None:
    """Answer llamapy and routing errors of ``app`` in the OpenAI shape (see also
    :class:`CatchAll` for the rest)."""
    app.add_exception_handler(LlamapyError, _llamapy_handler)
    app.add_exception_handler(HTTPException, _http_handler)


class BodyLimit:
    """ASGI middleware: bodies over ``max_bytes`` get a 413 (by header or while reading);
    ``shape`` answers it in the route's error shape (default: OpenAI's)."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 shape: Callable[[Request, Exception], Response] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.shape = shape

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            error = PayloadTooLargeError(self.max_bytes)
            response = error_response(error) if self.shape is None else \
                self.shape(Request(scope), error)
            await response(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Callable[[], Awaitable[Message]]:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise PayloadTooLargeError(self.max_bytes)
            return message

        return counted


class CatchAll:
    """ASGI middleware: an unexpected exception becomes a logged 500 in the OpenAI shape.

    Unlike Starlette's last-resort handler it does not re-raise, so the connection stays
    usable. After the response has started nothing can be sent: the error is only logged.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await error_response(exc)(scope, receive, send)
