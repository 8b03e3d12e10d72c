"""Newline-delimited JSON streams (``application/x-ndjson``), Ollama's streaming format.

One JSON object per line. As :func:`~.sse.event_stream` does for SSE, the response waits for
the first object, so a request the engine rejects gets its proper status instead of a 200
stream; after that an error becomes a last ``{"error": ...}`` line. The source is always
closed (cancelling the request and freeing its slot) when the response ends or the client
leaves.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import anyio
import orjson
from starlette.requests import Request

from .context import cancel_on_disconnect
from .sse import EventStreamResponse

Lines = AsyncGenerator[dict[str, Any], None]
#: The error object of a failed stream.
ErrorLine = Callable[[BaseException], dict[str, Any]]

MEDIA_TYPE = "application/x-ndjson"


def encode_line(item: object) -> bytes:
    """One line of the stream."""
    return orjson.dumps(item, option=orjson.OPT_NON_STR_KEYS) + b"\n"


class NdjsonResponse(EventStreamResponse):
    """A streaming NDJSON response that always closes its source (no keep-alive lines)."""

    def __init__(self, body: AsyncIterator[bytes], source: Lines) -> None:
        super().__init__(body, source, None)
        self.media_type = MEDIA_TYPE
        self.headers["content-type"] = MEDIA_TYPE


async def _first(lines: Lines) -> dict[str, Any] | None:
    try:
        return await anext(lines)
    except StopAsyncIteration:
        return None


async def ndjson_stream(request: Request, lines: Lines, *, error_line: ErrorLine
                        ) -> NdjsonResponse:
    """An NDJSON response for ``lines``; raises what the first one raises (before any byte)."""
    try:
        first = await cancel_on_disconnect(request, _first(lines))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await lines.aclose()
        raise

    async def body() -> AsyncIterator[bytes]:
        try:
            if first is not None:
                yield encode_line(first)
                async for item in lines:
                    yield encode_line(item)
        except Exception as exc:  # headers are out: report the error in the stream
            yield encode_line(error_line(exc))

    return NdjsonResponse(body(), lines)
