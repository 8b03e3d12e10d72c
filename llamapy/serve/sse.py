"""Server-sent events out of the API's async chunk iterators, with cancellation on disconnect.

:func:`event_stream` waits for the first chunk before answering, so a request the engine
rejects (queue full, context overflow) gets its proper status instead of a 200 stream. After
that, an error becomes an ``error`` event. When the client goes away the response is
cancelled; the chunk iterator is then closed in a shielded scope, which cancels the request on
the server and frees its slot at once.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .context import cancel_on_disconnect
from .errors import error_body

Chunks = AsyncGenerator[dict[str, Any], None]


def encode(data: object) -> bytes:
    """One SSE ``data:`` event (orjson: the per-token hot path; non-string keys become strings,
    as ``json`` does)."""
    return b"data: " + orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"


class EventStreamResponse(StreamingResponse):
    """A streaming response that always closes its chunk source, disconnect or not."""

    def __init__(self, body: AsyncIterator[bytes], source: Chunks) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._source = source

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._source.aclose()


async def _first(chunks: Chunks) -> dict[str, Any] | None:
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return None


async def event_stream(request: Request, chunks: Chunks, *, done_marker: bool = True,
                       on_chunk: Callable[[dict[str, Any]], None] | None = None
                       ) -> EventStreamResponse:
    """An SSE response for ``chunks``; raises what the first chunk raises (before any byte).

    A client that leaves while the request waits for its first token (queued, prefilling)
    cancels it too. ``done_marker`` ends the stream with ``data: [DONE]`` (OpenAI;
    llama-server's native ``/completion`` sends none). ``on_chunk`` sees every chunk.
    """
    try:
        first = await cancel_on_disconnect(request, _first(chunks))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await chunks.aclose()
        raise

    async def body() -> AsyncIterator[bytes]:
        try:
            if first is not None:
                if on_chunk:
                    on_chunk(first)
                yield encode(first)
                async for chunk in chunks:
                    if on_chunk:
                        on_chunk(chunk)
                    yield encode(chunk)
        except Exception as exc:  # headers are out: report the error in the stream
            yield encode(error_body(exc)[1])
        if done_marker:
            yield b"data: [DONE]\n\n"

    return EventStreamResponse(body(), chunks)
