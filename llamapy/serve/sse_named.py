"""Server-sent events with ``event:`` names, for the Anthropic and Responses streams.

Both APIs name every event (``event: message_start``, ``event: response.output_text.delta``)
and end without a ``[DONE]`` marker. Each event is a dict whose ``type`` is its name. The
stream is :func:`~.sse.framed_stream`'s; an error once the headers are out becomes the API's
``error`` event, made by ``error_event(exc, events_sent)``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .context import cache_headers, cancel_on_disconnect, stream_flag
from .sse import EventStreamResponse, Framing, framed_stream

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


async def named_event_stream(request: Request, events: Events, *,
                             error_event: ErrorEvent) -> EventStreamResponse:
    """An SSE response of named ``events`` (:func:`~.sse.framed_stream`); raises what the
    first event raises (before any byte)."""
    return await framed_stream(request, events, Framing(encode_named, error_event))
