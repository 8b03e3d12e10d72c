"""The Anthropic endpoints: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Handlers read JSON, call :mod:`llamapy.anthropic_api` and frame the result (JSON with the cache
headers, or SSE with named events). Errors, including a wrong key (``x-api-key`` or
``Authorization: Bearer``), answer in Anthropic's shape
(:func:`~llamapy.serve.anthropic_errors.anthropic_route_error`). The ``anthropic-version`` and
``anthropic-beta`` headers are accepted and change nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...anthropic_api import (
    MessagesBody,
    acreate_message,
    astream_message,
    count_message_tokens,
)
from ..anthropic_errors import anthropic_error_event, anthropic_route_error
from ..context import AppContext, cache_headers, cancel_on_disconnect, read_json, stream_flag
from ..routing import Router
from ..sse_named import named_event_stream


def anthropic_router(ctx: AppContext) -> Router:
    """The Anthropic Messages routes (behind the API key; every error in Anthropic's shape)."""
    router = Router(checks=[ctx.check_key], error_shape=anthropic_route_error)

    @router.post("/v1/messages", schema=MessagesBody.model_json_schema)
    async def messages(request: Request) -> Response:
        """Anthropic Messages (SSE with named events when ``stream``)."""
        body = await read_json(request)
        served = ctx.served(request)
        if stream_flag(body):
            events = astream_message(served, body, observe=ctx.metrics.observe)
            return await named_event_stream(request, events, error_event=anthropic_error_event)
        timings: dict[str, Any] = {}
        result = await cancel_on_disconnect(
            request, acreate_message(served, body, observe=timings.update))
        ctx.metrics.observe(timings)
        return JSONResponse(result, headers=cache_headers(timings))

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> dict[str, Any]:
        """``{"input_tokens": N}`` for a Messages request, nothing generated."""
        body = await read_json(request)  # (rendered and tokenized off the event loop)
        return await asyncio.to_thread(count_message_tokens, ctx.served(), body)

    return router
