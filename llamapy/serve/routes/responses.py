"""The OpenAI Responses endpoints and the prompt token counts.

``POST /v1/responses`` (and ``/responses``; ``previous_response_id`` and ``conversation``
continue stored state, and a response is kept unless ``store`` is false:
:mod:`llamapy.openai_api.responses_state`), ``POST /v1/responses/input_tokens`` and
``POST /v1/chat/completions/input_tokens`` (each also without ``/v1``, as llama-server has
them). Errors are in the OpenAI shape, like every OpenAI route; a stream reports an error after
its first event as the Responses ``error`` event.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...openai_api import (
    acreate_response,
    astream_response,
    count_chat_input_tokens,
    count_input_tokens,
)
from ...openai_api.responses import abackground_response
from ...openai_api.responses_params import ResponsesBody
from ...openai_api.responses_state import (
    Stored,
    akept_events,
    akept_response,
    continue_request,
)
from ..context import AppContext, read_json
from ..errors import error_body
from ..model_use import ON_MODEL
from ..routing import Router
from ..sse_named import named_event_answer


def responses_error_event(exc: BaseException, sent: int) -> dict[str, Any]:
    """The Responses stream's ``error`` event (numbered after the ``sent`` events)."""
    error = error_body(exc)[1]["error"]
    return {"type": "error", "code": error["code"] or error["type"],
            "message": error["message"], "param": error["param"], "sequence_number": sent}


async def background(ctx: AppContext, request: Request, body: dict[str, Any], stored: Stored
                     ) -> Response:
    """A ``background`` request: prepared now, answered ``queued``, run on in a task that
    holds its model (:mod:`llamapy.openai_api.responses_background`)."""
    runs = ctx.background
    assert runs is not None
    runs.check_request(body, stored)
    body = {key: value for key, value in body.items() if key != "background"}
    queued, work = await abackground_response(ctx.served(request), body,
                                              observe=ctx.metrics.observe)
    principal, model = ctx.principal(request), body.get("model")

    async def held() -> dict[str, Any]:  # the model held until the response ends
        async with ctx.source.hold(model if isinstance(model, str) else None, principal):
            return await work()

    return JSONResponse(await runs.start(stored, queued, held))


def responses_router(ctx: AppContext) -> Router:
    """The Responses and token count routes (behind the API key)."""
    router = Router(checks=[ctx.check_key], model=ON_MODEL)

    @router.post("/v1/responses", schema=ResponsesBody.model_json_schema)
    @router.post("/responses", hidden=True)
    async def responses(request: Request) -> Response:
        """OpenAI Responses (SSE with typed events when ``stream``; ``background``: answered
        at once, polled with ``GET /v1/responses/{id}``)."""
        served, store = ctx.served(request), ctx.response_store
        body, stored = await asyncio.to_thread(continue_request, store, ctx.tenant(request),
                                               await read_json(request))
        if ctx.background is not None and isinstance(body, dict) and body.get("background") is True:
            return await background(ctx, request, body, stored)
        return await named_event_answer(
            request, body, observe=ctx.metrics.observe, error_event=responses_error_event,
            stream=lambda observe: akept_events(
                astream_response(served, body, observe=observe), store, stored),
            create=lambda observe: akept_response(
                acreate_response(served, body, observe=observe), store, stored))

    @router.post("/v1/responses/input_tokens")
    @router.post("/responses/input_tokens", hidden=True)
    async def response_input_tokens(request: Request) -> dict[str, Any]:
        """The prompt tokens of a Responses request (a continued one's whole conversation),
        nothing generated."""
        body, _ = await asyncio.to_thread(continue_request, ctx.response_store,
                                          ctx.tenant(request), await read_json(request))
        return await asyncio.to_thread(count_input_tokens, ctx.served(), body)

    @router.post("/v1/chat/completions/input_tokens")
    @router.post("/chat/completions/input_tokens", hidden=True)
    async def chat_input_tokens(request: Request) -> dict[str, Any]:
        """The prompt tokens of a chat completions request, nothing generated."""
        body = await read_json(request)
        return await asyncio.to_thread(count_chat_input_tokens, ctx.served(), body)

    return router
