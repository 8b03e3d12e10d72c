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
from starlette.responses import Response

from ...anthropic_api import (
    MessagesBody,
    acreate_message,
    astream_message,
    count_message_tokens,
)
from ..anthropic_errors import anthropic_error_event, anthropic_route_error
from ..context import AppContext, read_json
from ..model_use import ON_MODEL
from ..routing import Router
from ..sse_named import named_event_answer


def anthropic_router(ctx: AppContext) -> Router:
    """The Anthropic Messages routes (behind the API key; every error in Anthropic's shape)."""
    router = Router(checks=[ctx.check_key], error_shape=anthropic_route_error,
                    model=ON_MODEL)

    @router.post("/v1/messages", schema=MessagesBody.model_json_schema)
    async def messages(request: Request) -> Response:
        """Anthropic Messages (SSE with named events when ``stream``)."""
        body = await read_json(request)
        served = ctx.served(request)
        return await named_event_answer(
            request, body, observe=ctx.metrics.observe, error_event=anthropic_error_event,
            stream=lambda observe: astream_message(served, body, observe=observe),
            create=lambda observe: acreate_message(served, body, observe=observe))

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> dict[str, Any]:
        """``{"input_tokens": N}`` for a Messages request, nothing generated."""
        body = await read_json(request)  # (rendered and tokenized off the event loop)
        return await asyncio.to_thread(count_message_tokens, ctx.served(), body)

    return router
