"""Errors in Anthropic's shape, for the Anthropic routes only.

``{"type": "error", "error": {"type", "message"}}`` with the status of the exception's
``http_status``; the error ``type`` comes from that status (:data:`ERROR_TYPES`), so it is
mapped by exception type, never by message text. :func:`anthropic_route_error` is the error
shape of the Anthropic router: every error of its routes, a wrong API key included. Streams
report an error after the first event as an ``error`` event with the same body.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..errors import LlamapyError
from .errors import error_headers

log = logging.getLogger("llamapy.serve")

#: Anthropic error ``type`` by HTTP status (anything else: ``api_error``).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` for any exception."""
    if isinstance(exc, LlamapyError):
        status, message = exc.http_status, str(exc)
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    else:
        status, message = 500, f"internal error: {type(exc).__name__}: {exc}"
    error = {"type": ERROR_TYPES.get(status, "api_error"), "message": message}
    return status, {"type": "error", "error": error}


def anthropic_error_response(exc: BaseException) -> JSONResponse:
    """The JSON response for an exception."""
    status, body = anthropic_error_body(exc)
    return JSONResponse(body, status_code=status, headers=error_headers(exc))


def anthropic_error_event(exc: BaseException, sent: int = 0) -> dict[str, Any]:
    """The stream's ``error`` event for an exception after the first event."""
    return anthropic_error_body(exc)[1]


def anthropic_route_error(request: Request, exc: Exception) -> JSONResponse:
    """The response of an Anthropic route that raised ``exc`` (an unexpected one is logged)."""
    if not isinstance(exc, (LlamapyError, HTTPException)):
        log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return anthropic_error_response(exc)
