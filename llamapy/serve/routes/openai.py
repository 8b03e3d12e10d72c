"""The OpenAI endpoints: chat completions, completions, models, embeddings.

Handlers only read JSON, call the library functions of :mod:`llamapy.openai_api` and frame the
result (JSON with cache headers, or SSE); errors propagate to the app's handlers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...errors import ModelNotFoundError, UnsupportedFeatureError
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
from ..multi import model_entry
from ..routing import Router
from ..sse import event_stream
from .embeddings import aembed, embedding_response, parse_embedding_request


def model_card(served: ServedModel) -> dict[str, Any]:
    """One entry of ``/v1/models`` (``aliases``: every name it answers to, the id first, as
    llama-server lists them)."""
    model = served.model
    return {"id": served.name, "object": "model", "created": served.created,
            "owned_by": "llamapy",
            "meta": {"n_ctx_train": model.n_ctx_train, "n_embd": model.n_embd,
                     "n_params": model.n_params, "size": model.size, "n_vocab": model.n_vocab,
                     "description": model.description},
            "aliases": [served.name, *served.aliases],
            **({"tags": list(served.tags)} if served.tags else {})}


def openai_router(ctx: AppContext) -> Router:
    """The ``/v1`` routes (and llama-server's unversioned chat alias)."""
    router = Router(checks=[ctx.check_key])
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


def _models_now(ctx: AppContext) -> dict[str, Any]:
    """``/v1/models`` of the one model, loaded or asleep (as it was; never half closed)."""
    with ctx.steady() as asleep:
        if asleep:
            return dict(ctx.asleep["models"])
        return {"object": "list", "data": [model_card(ctx.served())]}


def _model_now(ctx: AppContext, model_id: str) -> dict[str, Any]:
    """``/v1/models/{id}`` of the one model (asleep: as it was; looking does not wake it)."""
    with ctx.steady() as asleep:
        if asleep:
            card: dict[str, Any] = ctx.asleep["models"]["data"][0]
            if model_id not in card["aliases"]:
                raise ModelNotFoundError(f"model {model_id!r} is not served here")
            return card
        served = ctx.served()
        served.check_model(model_id)
        return model_card(served)


def _model_routes(router: Router, ctx: AppContext) -> None:
    @router.get("/v1/models")
    @router.get("/models", hidden=True)
    async def models(request: Request) -> dict[str, Any]:
        """The served model (with several: each with its ``status``)."""
        if ctx.models is not None:
            return ctx.models.model_list()
        return await run_in_threadpool(_models_now, ctx)

    @router.get("/v1/models/{model_id:path}")
    async def model(request: Request) -> dict[str, Any]:
        """One model by id (404 unless served here)."""
        model_id: str = request.path_params["model_id"]
        if ctx.models is not None:
            return model_entry(ctx.models.manager.status_of(model_id))
        return await run_in_threadpool(_model_now, ctx, model_id)

    @router.post("/v1/embeddings")
    @router.post("/embeddings", hidden=True)
    async def embeddings(request: Request) -> dict[str, Any]:
        """Mean-pooled, normalised embeddings on a dedicated context."""
        body = await read_json(request)
        served = ctx.served()
        if not ctx.embeddings:
            raise UnsupportedFeatureError("embeddings", "embeddings are disabled on this server")
        inputs, fmt = await asyncio.to_thread(parse_embedding_request, served, body)
        with ctx.embedder(served) as embedder:
            vectors = await aembed(embedder, inputs)
        return embedding_response(served, inputs, vectors, fmt)

