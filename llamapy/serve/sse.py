"""Streamed answers: one framer (:func:`framed_stream`) for every API's stream, with the
framings of SSE (here), SSE with named events (:mod:`.sse_named`) and NDJSON (:mod:`.ndjson`).

The framer waits for the first item before answering, so a request the engine rejects (queue
full, context overflow) gets its proper status instead of a 200 stream. After that, an error
becomes the framing's error item. When the client goes away the response is cancelled; the
item source is then closed in a shielded scope, which cancels the request on the server and
frees its slot at once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
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
                 ping_s: float | None = None, media_type: str = "text/event-stream") -> None:
        super().__init__(body, media_type=media_type,
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


@dataclass(frozen=True, slots=True)
class Framing:
    """How a stream's items become bytes: ``encode`` frames one item; ``error`` is the item an
    exception becomes once the headers are out (given how many items were sent); ``end`` is
    sent after the last item; ``media_type`` and ``pings`` (keep-alive comments, SSE only)
    describe the response."""

    encode: Callable[[Any], bytes]
    error: Callable[[BaseException, int], Any]
    end: bytes = b""
    media_type: str = "text/event-stream"
    pings: bool = True


async def _first(items: Chunks) -> dict[str, Any] | None:
    try:
        return await anext(items)
    except StopAsyncIteration:
        return None


async def framed_stream(request: Request, items: Chunks, framing: Framing, *,
                        on_item: Callable[[dict[str, Any]], None] | None = None
                        ) -> EventStreamResponse:
    """The one streamed answer of every API: ``items`` framed by ``framing``; raises what the
    first item raises (before any byte).

    A client that leaves while the request waits for its first item (queued, prefilling)
    cancels it too; after that an error becomes ``framing.error``'s item. ``on_item`` sees
    every item. The source is closed (the request cancelled) however the response ends.
    """
    try:
        first = await cancel_on_disconnect(request, _first(items))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await items.aclose()
        raise

    async def body() -> AsyncIterator[bytes]:
        sent = 0
        try:
            if first is not None:
                if on_item:
                    on_item(first)
                yield framing.encode(first)
                sent += 1
                async for item in items:
                    if on_item:
                        on_item(item)
                    yield framing.encode(item)
                    sent += 1
        except Exception as exc:  # headers are out: report the error in the stream
            yield framing.encode(framing.error(exc, sent))
        if framing.end:
            yield framing.end

    ping_s = ping_interval(request) if framing.pings else None
    return EventStreamResponse(body(), items, ping_s, framing.media_type)


def _sse_error(exc: BaseException, sent: int) -> dict[str, Any]:
    return error_body(exc)[1]


#: OpenAI's and llama-server's SSE: ``data:`` events; OpenAI's end with ``data: [DONE]``.
SSE = Framing(encode, _sse_error, b"data: [DONE]\n\n")
SSE_NO_DONE = Framing(encode, _sse_error)


async def event_stream(request: Request, chunks: Chunks, *, done_marker: bool = True,
                       on_chunk: Callable[[dict[str, Any]], None] | None = None
                       ) -> EventStreamResponse:
    """An SSE response for ``chunks`` (:func:`framed_stream`): ``done_marker`` ends it with
    ``data: [DONE]`` (OpenAI; llama-server's native ``/completion`` sends none)."""
    return await framed_stream(request, chunks, SSE if done_marker else SSE_NO_DONE,
                               on_item=on_chunk)
