"""Errors in Ollama's shape, for the Ollama routes only: ``{"error": "message"}``.

The status is the exception's ``http_status`` (mapped by type, never by message text): 400 for
a bad request, 401 / 403 for a wrong or insufficient API key, 404 for an unknown model, 503
while the model loads; anything unexpected is a logged 500. A stream that fails after its
first line ends with one ``{"error": ...}`` line, as Ollama's do.
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


def ollama_error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` for any exception."""
    if isinstance(exc, LlamapyError):
        return exc.http_status, {"error": str(exc)}
    if isinstance(exc, HTTPException):
        return exc.status_code, {"error": str(exc.detail)}
    return 500, {"error": f"internal error: {type(exc).__name__}: {exc}"}


def ollama_error_response(exc: BaseException) -> JSONResponse:
    """The JSON response for an exception."""
    status, body = ollama_error_body(exc)
    return JSONResponse(body, status_code=status, headers=error_headers(exc))


def ollama_route_error(request: Request, exc: Exception) -> JSONResponse:
    """The response of an Ollama route that raised ``exc`` (an unexpected one is logged)."""
    if not isinstance(exc, (LlamapyError, HTTPException)):
        log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return ollama_error_response(exc)


def ollama_error_line(exc: BaseException) -> dict[str, Any]:
    """The last line of a stream that failed after its first (an unexpected error is
    logged)."""
    if not isinstance(exc, (LlamapyError, HTTPException)):
        log.error("unexpected error in an Ollama stream", exc_info=exc)
    return ollama_error_body(exc)[1]
