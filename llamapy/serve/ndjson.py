"""Newline-delimited JSON streams (``application/x-ndjson``), Ollama's streaming format.

One JSON object per line, no keep-alive lines. The stream is :func:`~.sse.framed_stream`'s;
an error once the headers are out becomes a last ``{"error": ...}`` line.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

import orjson
from starlette.requests import Request

from .sse import EventStreamResponse, Framing, framed_stream

Lines = AsyncGenerator[dict[str, Any], None]
#: The error object of a failed stream.
ErrorLine = Callable[[BaseException], dict[str, Any]]

MEDIA_TYPE = "application/x-ndjson"


def encode_line(item: object) -> bytes:
    """One line of the stream."""
    return orjson.dumps(item, option=orjson.OPT_NON_STR_KEYS) + b"\n"


async def ndjson_stream(request: Request, lines: Lines, *, error_line: ErrorLine
                        ) -> EventStreamResponse:
    """An NDJSON response for ``lines`` (:func:`~.sse.framed_stream`); raises what the first
    one raises (before any byte)."""
    framing = Framing(encode_line, lambda exc, _sent: error_line(exc), media_type=MEDIA_TYPE,
                      pings=False)
    return await framed_stream(request, lines, framing)
