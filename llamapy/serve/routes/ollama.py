"""Ollama's native API: ``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/embeddings``,
``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, ``/api/pull`` (success for a
served model; with ``--pull-on-demand`` a Hub model named ``hf.co/ORG/REPO[:QUANT]`` is pulled
into the store, by an admin's key only when keys carry tenants), and refusals for ``push``,
``create``, ``copy`` and ``delete``.

Handlers read JSON, call :mod:`llamapy.ollama_api` and frame the result: NDJSON while
``stream`` (Ollama's default) is true, else one JSON object. Every error, a wrong API key
included, is ``{"error": "..."}`` (:mod:`.ollama_errors`). A request with no messages (no
prompt) only loads the model: ``done_reason`` ``load``, or ``unload`` with ``keep_alive`` 0.
``keep_alive`` goes to the model manager when the app serves several models (the model's idle
time to live from then on; a request without one restores the configured one); with one model
it is validated and the model stays loaded (the process owns it). When keys carry tenants the
models are shared, so only an admin's key sets ``keep_alive``: a tenant key's is validated and
ignored, the request served as usual (Ollama clients send ``keep_alive`` on their own; a
refusal would break them) and the model keeps the keep-alive it had; ``keep_alive: 0`` from a
tenant key unloads nothing, its load-only request answering ``done_reason`` ``load``. With
several models ``/api/chat``, ``generate``, ``embed``, ``embeddings`` and ``show`` lease (and
so load) their model; ``/api/tags`` and ``/api/ps`` load nothing. ``/`` stays the chat page (it
is not Ollama's "Ollama is running").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...errors import UnsupportedFeatureError
from ...ollama_api import (
    ChatBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    ModelOpBody,
    OllamaPlan,
    ShowBody,
    acomplete,
    astream,
    created_at,
    embed_inputs,
    embed_response,
    keep_alive,
    model_entry,
    prepare_chat_request,
    prepare_generate,
    refuse_model_op,
    served_name,
    show,
    version,
)
from ...ollama_api.models import rfc3339, running_entry, unloaded_entry
from ...openai_api import ServedModel
from ...openai_api.params import parse_body
from ..context import AppContext, cancel_on_disconnect, read_json
from ..model_use import ON_MODEL
from ..ndjson import ndjson_stream
from ..ollama_errors import ollama_error_line, ollama_route_error
from ..routing import Router
from .embeddings import aembed

#: ``expires_at`` of a model kept loaded for good.
FOREVER = "9999-12-31T23:59:59Z"


def ollama_router(ctx: AppContext) -> Router:
    """The Ollama routes (behind the API key; every error in Ollama's shape)."""
    router = Router(checks=[ctx.check_key], error_shape=ollama_route_error)
    _generation_routes(router, ctx)
    _embedding_routes(router, ctx)
    _model_routes(router, ctx)
    _management_routes(router, ctx)
    return router


def _keep(ctx: AppContext, request: Request, name: str, value: object) -> float | None:
    """Validate ``keep_alive``; with several models, hand it to the manager, for an admin's
    key only (a tenant key's changes nothing: see the module). The seconds that apply (None:
    the model's own)."""
    seconds = keep_alive(value)
    if not ctx.principal(request).admin:
        return None
    ctx.source.keep(name, seconds)
    return seconds


def _load_only(body: ChatBody | GenerateBody, seconds: float | None) -> dict[str, Any]:
    """The answer to a request that only loads (or unloads) its model."""
    out: dict[str, Any] = {"model": body.model, "created_at": created_at()}
    if isinstance(body, ChatBody):
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out.update(done=True, done_reason="unload" if seconds == 0 else "load")
    return out


def _is_load_only(body: ChatBody | GenerateBody) -> bool:
    """Whether a request only loads its model (no messages, no prompt)."""
    return not body.messages if isinstance(body, ChatBody) else not body.prompt


async def _answer(request: Request, ctx: AppContext, plan: OllamaPlan, stream: bool
                  ) -> Response:
    """NDJSON chunks (``stream``) or the one final object of ``plan``."""
    if stream:
        return await ndjson_stream(request, astream(plan, ctx.metrics.observe),
                                   error_line=ollama_error_line)
    result = await cancel_on_disconnect(request, acomplete(plan, ctx.metrics.observe))
    return JSONResponse(result)


def _generation_routes(router: Router, ctx: AppContext) -> None:
    async def generate(request: Request, body: ChatBody | GenerateBody,
                       prepare: Callable[[ServedModel, Any], OllamaPlan]) -> Response:
        served = ctx.served(request)
        seconds = _keep(ctx, request, served_name(served, body.model), body.keep_alive)
        if _is_load_only(body):
            return JSONResponse(_load_only(body, seconds))
        plan = await asyncio.to_thread(prepare, served, body)
        return await _answer(request, ctx, plan, body.stream)

    @router.post("/api/chat", schema=ChatBody.model_json_schema, model=ON_MODEL)
    async def chat(request: Request) -> Response:
        """Ollama chat (NDJSON unless ``stream`` is false)."""
        body = await asyncio.to_thread(parse_body, ChatBody, await read_json(request))
        return await generate(request, body, prepare_chat_request)

    @router.post("/api/generate", schema=GenerateBody.model_json_schema, model=ON_MODEL)
    async def generate_text(request: Request) -> Response:
        """Ollama generate: a prompt, through the chat template unless ``raw``."""
        body = await asyncio.to_thread(parse_body, GenerateBody, await read_json(request))
        return await generate(request, body, prepare_generate)


def _embedding_routes(router: Router, ctx: AppContext) -> None:
    async def vectors(request: Request, body: EmbedBody) -> dict[str, Any]:
        started = time.perf_counter_ns()
        served = ctx.served(request)
        if not ctx.embeddings:
            raise UnsupportedFeatureError("embeddings", "embeddings are disabled on this server")
        _keep(ctx, request, served_name(served, body.model), body.keep_alive)
        with ctx.embedder(served) as embedder:
            inputs = await asyncio.to_thread(embed_inputs, served, body,
                                             embedder.max_input_tokens)
            rows = await aembed(request, embedder, inputs)
        return embed_response(body.model, rows.tolist(), inputs, started)

    @router.post("/api/embed", schema=EmbedBody.model_json_schema, model=ON_MODEL)
    async def embed(request: Request) -> dict[str, Any]:
        """Embeddings of one input or several."""
        return await vectors(request, parse_body(EmbedBody, await read_json(request)))

    @router.post("/api/embeddings", schema=EmbeddingsBody.model_json_schema,
                 model=ON_MODEL)
    async def embeddings(request: Request) -> dict[str, Any]:
        """The legacy form: one ``prompt``, one ``embedding`` (empty for an empty prompt)."""
        body = parse_body(EmbeddingsBody, await read_json(request))
        if not body.prompt:
            served_name(ctx.served(request), body.model)
            return {"embedding": []}
        result = await vectors(request, EmbedBody(model=body.model, input=body.prompt,
                                                  keep_alive=body.keep_alive))
        return {"embedding": result["embeddings"][0]}


def _tags(ctx: AppContext) -> dict[str, Any]:
    """``/api/tags``: every served model (blocking: digests)."""
    return {"models": [model_entry(item.served) if item.served is not None
                       else unloaded_entry(item.name, item.path)
                       for item in ctx.source.listing()]}


def _ps(ctx: AppContext) -> dict[str, Any]:
    """``/api/ps``: the loaded models (blocking: digests)."""
    out = []
    for item in ctx.source.listing():
        if item.served is None:
            continue
        finite = 0 <= item.keep_alive < float("inf")
        expires = rfc3339(time.time() + item.keep_alive) if finite else FOREVER
        out.append(running_entry(item.served, expires))
    return {"models": out}


def _model_routes(router: Router, ctx: AppContext) -> None:
    @router.get("/api/tags")
    async def tags(request: Request) -> dict[str, Any]:
        """The served models (with several: loaded or not)."""
        return await run_in_threadpool(_tags, ctx)

    @router.get("/api/ps")
    async def ps(request: Request) -> dict[str, Any]:
        """The loaded models."""
        return await run_in_threadpool(_ps, ctx)

    @router.get("/api/version")
    async def api_version(request: Request) -> dict[str, Any]:
        """The Ollama API version these routes follow (and llamapy's)."""
        return version()

    @router.post("/api/show", schema=ShowBody.model_json_schema, model=ON_MODEL)
    async def show_model(request: Request) -> dict[str, Any]:
        """A model's template, parameters, details, GGUF metadata and capabilities."""
        body = parse_body(ShowBody, await read_json(request))
        served = ctx.served(request)
        served_name(served, body.model_name)
        return await run_in_threadpool(show, served, ctx.embeddings)


def _management_routes(router: Router, ctx: AppContext) -> None:
    @router.post("/api/pull")
    async def pull(request: Request) -> Response:
        """Success for a model that is served; with ``--pull-on-demand`` a Hub model
        (``hf.co/ORG/REPO[:QUANT]``; admin keys only when keys carry tenants) is pulled into
        the store and served first (the answer comes when the pull ends: no progress lines);
        otherwise a typed refusal."""
        body = parse_body(ModelOpBody, await read_json(request))
        if ctx.source.pulls and body.model_name:
            await ctx.source.pick_or_pull(body.model_name, ctx.principal(request))
        elif not ctx.source.serves(body.model_name):
            raise refuse_model_op("pull")
        if body.stream:
            return Response(b'{"status":"success"}\n', media_type="application/x-ndjson")
        return JSONResponse({"status": "success"})

    def refusal(operation: str) -> Any:
        async def refuse(request: Request) -> Response:
            raise refuse_model_op(operation)
        refuse.__name__ = operation
        refuse.__doc__ = f"Not supported: answers a typed 400 ({operation})."
        return refuse

    for operation in ("push", "create", "copy"):
        router.post(f"/api/{operation}")(refusal(operation))
    router.delete("/api/delete")(refusal("delete"))
