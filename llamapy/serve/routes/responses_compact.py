"""OpenAI's ``POST /v1/responses/compact`` (and ``/responses/compact``), as Codex calls it.

The request runs as a whole-JSON Responses request does (:mod:`.responses`): behind the API
key, as the key's tenant sees the model, cancelled when the client leaves, its timings counted
by the metrics and sent back in the ``X-Llamapy-Cache-*`` headers; errors are in the OpenAI
shape. ``previous_response_id`` names a stored conversation to compact
(:mod:`llamapy.openai_api.responses_state`). What it answers:
:mod:`llamapy.openai_api.responses_compact`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...openai_api.responses_compact import CompactBody, acompact_response
from ...openai_api.responses_state import continue_request
from ..context import AppContext, cache_headers, cancel_on_disconnect, read_json
from ..model_use import ON_MODEL
from ..routing import Router


def compact_router(ctx: AppContext) -> Router:
    """The compact route (behind the API key)."""
    router = Router(checks=[ctx.check_key], model=ON_MODEL)

    @router.post("/v1/responses/compact", schema=CompactBody.model_json_schema)
    @router.post("/responses/compact", hidden=True)
    async def compact(request: Request) -> Response:
        """OpenAI Responses compaction: the conversation's user messages and one
        ``compaction`` item summarising it (``previous_response_id``: a stored
        conversation, then ``input``)."""
        served = ctx.served(request)
        body, _ = await asyncio.to_thread(continue_request, ctx.response_store,
                                          ctx.tenant(request), await read_json(request))
        timings: dict[str, Any] = {}
        result = await cancel_on_disconnect(
            request, acompact_response(served, body, observe=timings.update))
        ctx.metrics.observe(timings)
        return JSONResponse(result, headers=cache_headers(timings))

    return router
