"""Server-sent events out of the API's async chunk iterators, with cancellation on disconnect.

:func:`event_stream` waits for the first chunk before answering, so a request the engine
rejects (queue full, context overflow) gets its proper status instead of a 200 stream. After
that, an error becomes an ``error`` event. When the client goes away the response is
cancelled; the chunk iterator is then closed in a shielded scope, which cancels the request on
the server and frees its slot at once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from .context import cancel_on_disconnect
from .errors import error_body

Chunks = AsyncGenerator[dict[str, Any], None]


def encode(data: object) -> bytes:
    """One SSE ``data:`` event (orjson: the per-token hot path; non-string keys become strings,
    as ``json`` does)."""
    return b"data: " + orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"


#: llama-server's keep-alive: an SSE comment line, ignored by every client.
PING = b":\n\n"


def ping_interval(request: Request) -> float | None:
    """The app's ``sse_ping_interval`` in seconds (None: no pings)."""
    ctx = getattr(request.app.state, "llamapy", None)
    value = getattr(ctx, "sse_ping_interval", None)
    return float(value) if value is not None and value > 0 else None


class EventStreamResponse(StreamingResponse):
    """A streaming response that always closes its chunk source, disconnect or not.

    With ``ping_s``, a stream that sent nothing for that long (a long prefill, a queue) gets
    llama-server's keep-alive comment, so a client or proxy with an idle timeout keeps it."""

    def __init__(self, body: AsyncIterator[bytes], source: Chunks,
                 ping_s: float | None = None) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._source = source
        self._ping_s = ping_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._source.aclose()

    async def stream_response(self, send: Send) -> None:
        """Starlette's, with the keep-alive task beside it when ``ping_s`` is set."""
        interval = self._ping_s
        if interval is None:
            await super().stream_response(send)
            return
        last, open_ = [time.monotonic()], [True]

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.body":
                open_[0] = message.get("more_body", False)
            last[0] = time.monotonic()
            await send(message)

        async def keep_alive() -> None:
            while True:
                await anyio.sleep(max(0.0, last[0] + interval - time.monotonic()))
                if not open_[0]:
                    return
                if time.monotonic() - last[0] >= interval:
                    await timed({"type": "http.response.body", "body": PING, "more_body": True})

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(keep_alive)
            await super().stream_response(timed)
            tasks.cancel_scope.cancel()


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

    return EventStreamResponse(body(), chunks, ping_interval(request))
