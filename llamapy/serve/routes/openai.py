"""The OpenAI endpoints: chat completions, completions, models, embeddings.

Handlers only read JSON, call the library functions of :mod:`llamapy.openai_api` and frame the
result (JSON with cache headers, or SSE); errors propagate to the app's handlers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...errors import UnsupportedFeatureError
from ...openai_api import (
    ChatBody,
    CompletionBody,
    ServedModel,
    achat_completion,
    acompletion,
    astream_chat_completion,
    astream_completion,
)
from ..context import (
    AppContext,
    cache_headers,
    cancel_on_disconnect,
    final_timings,
    read_json,
    stream_flag,
)
from ..model_use import NO_MODEL, ON_MODEL
from ..pages.tenant_view import models_view
from ..routing import Router
from ..sse import event_stream
from .embeddings import aembed, embedding_response, parse_embedding_request


def openai_router(ctx: AppContext) -> Router:
    """The ``/v1`` routes (and llama-server's unversioned chat alias)."""
    router = Router(checks=[ctx.check_key], model=ON_MODEL)
    _generation_routes(router, ctx)
    _model_routes(router, ctx)
    return router


def _generation_routes(router: Router, ctx: AppContext) -> None:
    async def generate(request: Request, body: Any, *, chat: bool) -> Response:
        served = ctx.served(request)
        if stream_flag(body):
            chunks = (astream_chat_completion if chat else astream_completion)(served, body)
            return await event_stream(request, chunks, on_chunk=final_timings(ctx.metrics.observe))
        run = achat_completion if chat else acompletion
        result = await cancel_on_disconnect(request, run(served, body))
        ctx.metrics.observe(result.get("timings"))
        return JSONResponse(result, headers=cache_headers(result.get("timings")))

    @router.post("/v1/chat/completions", schema=ChatBody.model_json_schema)
    @router.post("/chat/completions", hidden=True)
    async def chat_completions(request: Request) -> Response:
        """OpenAI chat completions (SSE when ``stream``)."""
        return await generate(request, await read_json(request), chat=True)

    @router.post("/v1/completions", schema=CompletionBody.model_json_schema)
    async def completions(request: Request) -> Response:
        """OpenAI text completions (SSE when ``stream``)."""
        return await generate(request, await read_json(request), chat=False)


def _model_routes(router: Router, ctx: AppContext) -> None:
    @router.get("/v1/models", model=NO_MODEL)
    @router.get("/models", hidden=True, model=NO_MODEL)
    async def models(request: Request) -> dict[str, Any]:
        """The served model (with several: each with its ``status``; a key that is not an
        admin's sees no model path in a failed load's error)."""
        return await run_in_threadpool(_models_seen, ctx, request, ctx.source.model_list)

    @router.get("/v1/models/{model_id:path}", model=NO_MODEL)
    async def model(request: Request) -> dict[str, Any]:
        """One model by id (404 unless served here)."""
        model_id: str = request.path_params["model_id"]
        return await run_in_threadpool(_models_seen, ctx, request,
                                       lambda: ctx.source.model_entry(model_id))

    @router.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        """Mean-pooled, normalised embeddings on a dedicated context."""
        served, inputs, vectors, fmt = await _embed(request)
        return embedding_response(served, inputs, vectors, fmt)

    @router.post("/embeddings", hidden=True)
    async def native_embeddings(request: Request) -> list[dict[str, Any]]:
        """llama-server's ``/embeddings``: ``[{"index", "embedding": [vector]}]``."""
        _, _, vectors, _ = await _embed(request)
        return [{"index": i, "embedding": [[float(x) for x in v]]} for i, v in enumerate(vectors)]

    async def _embed(request: Request) -> tuple[ServedModel, list[Sequence[int]], Any, str]:
        body = await read_json(request)
        served = ctx.served(request)  # (the key's tenant: its requests are bounded)
        if not ctx.embeddings:
            raise UnsupportedFeatureError("embeddings", "embeddings are disabled on this server")
        inputs, fmt = await asyncio.to_thread(parse_embedding_request, served, body)
        with ctx.embedder(served) as embedder:
            vectors = await aembed(request, embedder, inputs)
        return served, inputs, vectors, fmt


def _models_seen(ctx: AppContext, request: Request,
                 read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``read()`` (``/v1/models`` or one entry) as the request's key sees it
    (:func:`~llamapy.serve.pages.tenant_view.models_view`; blocking)."""
    principal = ctx.principal(request)
    listing = read()
    if principal.admin:
        return listing
    return models_view(listing, principal, [item.path for item in ctx.source.listing()])
