"""Server-sent events with ``event:`` names, for the Anthropic and Responses streams.

Both APIs name every event (``event: message_start``, ``event: response.output_text.delta``)
and end without a ``[DONE]`` marker. Each event is a dict whose ``type`` is its name. As in
:func:`~.sse.event_stream`, the response waits for the first event, so a request the engine
rejects gets its proper status; after that an error becomes the API's ``error`` event, made by
``error_event(exc, events_sent)``. The event source is always closed (cancelling the request)
when the response ends or the client leaves.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .context import cache_headers, cancel_on_disconnect, stream_flag
from .sse import EventStreamResponse, ping_interval

Events = AsyncGenerator[dict[str, Any], None]
#: Builds the API's ``error`` event for an exception, given how many events were sent.
ErrorEvent = Callable[[BaseException, int], dict[str, Any]]
#: Timings observer (a request's final ``timings``).
Observe = Callable[[Mapping[str, Any]], None]


async def named_event_answer(request: Request, body: Any, *, observe: Observe,
                             stream: Callable[[Observe], Events],
                             create: Callable[[Observe], Awaitable[dict[str, Any]]],
                             error_event: ErrorEvent) -> Response:
    """A Messages or Responses request answered: with ``stream`` in ``body``, the named events
    of ``stream(observe)``; else ``create``'s JSON, with the reuse headers, its timings passed
    to ``observe`` once the request is done (cancelled if the client leaves)."""
    if stream_flag(body):
        return await named_event_stream(request, stream(observe), error_event=error_event)
    timings: dict[str, Any] = {}
    result = await cancel_on_disconnect(request, create(timings.update))
    observe(timings)
    return JSONResponse(result, headers=cache_headers(timings))


def encode_named(event: Mapping[str, Any]) -> bytes:
    """One SSE event named by its ``type``."""
    data = json.dumps(event, ensure_ascii=False)
    return f"event: {event.get('type', 'message')}\ndata: {data}\n\n".encode()


async def _first(events: Events) -> dict[str, Any] | None:
    try:
        return await anext(events)
    except StopAsyncIteration:
        return None


async def named_event_stream(request: Request, events: Events, *,
                             error_event: ErrorEvent) -> EventStreamResponse:
    """An SSE response for ``events``; raises what the first event raises (before any byte)."""
    try:
        first = await cancel_on_disconnect(request, _first(events))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await events.aclose()
        raise

    async def body() -> AsyncIterator[bytes]:
        sent = 0
        try:
            if first is not None:
                yield encode_named(first)
                sent += 1
                async for event in events:
                    yield encode_named(event)
                    sent += 1
        except Exception as exc:  # headers are out: report the error in the stream
            yield encode_named(error_event(exc, sent))

    return EventStreamResponse(body(), events, ping_interval(request))
