"""llama-server's own endpoints, so its clients work: ``/completion``, ``/tokenize``,
``/detokenize``, ``/apply-template``, ``/props``, ``/slots``, plus ``/health`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...engine import ProgressEvent, TokenEvent
from ...openai_api import ServedModel
from ...openai_api import llama_compat as compat
from ...openai_api.infill import check_infill, infill_tokens
from ..context import (
    AppContext,
    cache_headers,
    cancel_on_disconnect,
    final_timings,
    read_json,
    stream_flag,
)
from ..errors import error_response
from ..metrics.compat import PROCESS_START
from ..model_use import NAMED_MODEL, ON_MODEL, READS_MODEL
from ..pages.tenant_view import props_view, slot_view
from ..routing import Router, path_int, query_required
from ..sse import event_stream
from . import slot_files

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
#: ``/infill`` fields that become its prompt.
INFILL_FIELDS = ("input_prefix", "input_suffix", "input_extra", "prompt")


async def stream_native(served: ServedModel, body: Any) -> AsyncGenerator[dict[str, Any], None]:
    """Streamed ``/completion`` chunks, then the final ``stop: true`` chunk with timings; with
    several prompts, each prompt's in turn (``index`` tells them apart)."""
    prompts, request = await asyncio.to_thread(compat.prepare_native, served, body)
    for index, (ids, text, intent) in enumerate(prompts):
        n_done = 0
        async with aclosing(served.aevents(ids, intent)) as events:
            async for event in events:
                if isinstance(event, TokenEvent):
                    n_done += 1
                    chunk = compat.native_chunk(served, request, event, n_done, ids)
                elif isinstance(event, ProgressEvent):
                    chunk = compat.native_progress(served, event, ids)
                else:
                    chunk = compat.native_final(served, ids, text, intent, event)
                yield {**chunk, "index": index}


async def complete_native(served: ServedModel, body: Any) -> list[dict[str, Any]]:
    """The whole ``/completion`` response of each prompt (run concurrently)."""
    prompts, request = await asyncio.to_thread(compat.prepare_native, served, body)
    done = await served.acomplete_all([(ids, intent) for ids, _, intent in prompts])
    return [compat.native_response(served, ids, text, intent, request, completion, index)
            for index, ((ids, text, intent), completion) in enumerate(zip(prompts, done,
                                                                          strict=True))]


def health_router(ctx: AppContext) -> Router:
    """``/health``: open even with an API key; 503 while the model loads."""
    router = Router()

    @router.get("/health")
    @router.get("/v1/health", hidden=True)
    async def health(request: Request) -> Response:
        """200 ``{"status": "ok"}`` when ready, else the 503 error saying why (with several
        models: ok while serving; ``/v1/models`` tells each model's state)."""
        try:
            ctx.source.check_health()
        except Exception as exc:
            return error_response(exc)
        return JSONResponse({"status": "ok"})

    return router


def llama_router(ctx: AppContext) -> Router:
    """The llama-server-compatible routes (behind the API key)."""
    router = Router(checks=[ctx.check_key], model=ON_MODEL)
    _completion_routes(router, ctx)
    _tool_routes(router, ctx)
    _status_routes(router, ctx)
    return router


def _completion_routes(router: Router, ctx: AppContext) -> None:
    @router.post("/completion")
    @router.post("/completions", hidden=True)
    async def completion(request: Request) -> Response:
        """llama-server's native completion (``n_predict``, ``timings``, ...)."""
        body = await read_json(request)
        return await native_answer(ctx, request, ctx.served(request), body)

    @router.post("/infill")
    async def infill(request: Request) -> Response:
        """llama-server's fill-in-the-middle (501 for a model without FIM tokens)."""
        served = ctx.served(request)
        body = await asyncio.to_thread(infill_body, served, await read_json(request))
        return await native_answer(ctx, request, served, body)


async def native_answer(ctx: AppContext, request: Request, served: ServedModel, body: Any
                        ) -> Response:
    """A ``/completion``-shaped answer to ``body``: streamed (SSE) or whole, observed."""
    if stream_flag(body):
        return await event_stream(request, stream_native(served, body), done_marker=False,
                                  on_chunk=final_timings(ctx.metrics.observe))
    results = await cancel_on_disconnect(request, complete_native(served, body))
    for result in results:
        ctx.metrics.observe(result["timings"])
    headers = cache_headers(results[0]["timings"])
    fields = body.get("response_fields") if isinstance(body, dict) else None
    results = [compat.select_fields(result, fields or []) for result in results]
    # llama-server's shape: the object for one prompt, the list for several
    return JSONResponse(results[0] if len(results) == 1 else results, headers=headers)


def infill_body(served: ServedModel, body: Any) -> dict[str, Any]:
    """An ``/infill`` body as the ``/completion`` body of its FIM prompt token ids."""
    model = served.model
    fim = model.fim_tokens
    check_infill(fim, body)
    start = served.server.start_options
    n_predict = next((body[k] for k in compat.BUDGET_FIELDS if k in body), -1)
    ids = infill_tokens(
        fim, lambda text: model.tokenize(text, add_special=False, parse_special=False), body,
        n_batch=start.server.effective_n_batch,
        n_predict=n_predict if isinstance(n_predict, int) else -1,
        n_ctx=compat.slot_n_ctx(served), spm=served.spm_infill,
        bos=model.bos if model.add_bos and model.bos >= 0 else None)
    rest = {k: v for k, v in body.items() if k not in INFILL_FIELDS}
    return {**rest, "prompt": ids}


def _tool_routes(router: Router, ctx: AppContext) -> None:
    @router.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        """Text to tokens (``with_pieces`` adds each token's text)."""
        body = await read_json(request)
        return await asyncio.to_thread(compat.tokenize, ctx.served(), body)

    @router.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        """Tokens to text."""
        body = await read_json(request)
        return await asyncio.to_thread(compat.detokenize, ctx.served(), body)

    @router.post("/apply-template")
    async def apply_template(request: Request) -> dict[str, Any]:
        """The prompt a chat request renders to."""
        body = await read_json(request)
        return await asyncio.to_thread(compat.apply_template, ctx.served(), body)


def _props_now(ctx: AppContext) -> dict[str, Any]:
    """``/props`` as the model is: loaded, or asleep (its snapshot; never half closed)."""
    with ctx.steady() as asleep:
        return dict(ctx.asleep["props"]) if asleep else compat.props(ctx.served())


def _props_routes(router: Router, ctx: AppContext) -> None:
    @router.get("/props", model=READS_MODEL)
    async def props(request: Request) -> dict[str, Any]:
        """Default generation settings, slot count, model and template (while the model
        sleeps: as they were, with ``is_sleeping: true``; it stays asleep)."""
        endpoints = {"endpoint_slots": ctx.slots, "endpoint_props": ctx.props_endpoint,
                     "endpoint_metrics": ctx.metrics_endpoint}
        props = props_view(await run_in_threadpool(_props_now, ctx), ctx.principal(request))
        return {**props, **endpoints}

    @router.post("/props", model=READS_MODEL)
    async def change_props(request: Request) -> dict[str, Any]:
        """llama-server's ``POST /props``: 501 unless started with ``--props``; the pinned
        llama-server changes no property there yet and answers success, and so does this."""
        ctx.check_enabled("props")
        await read_json(request)  # malformed JSON is still a 400
        return {"success": True}


def _status_routes(router: Router, ctx: AppContext) -> None:
    _props_routes(router, ctx)

    @router.get("/slots")
    async def slots(request: Request) -> list[dict[str, Any]]:
        """Each slot's state and cached tokens (501 with ``--no-slots``; a tenant key sees
        other tenants' slots bare, :mod:`llamapy.serve.pages.tenant_view`)."""
        ctx.check_enabled("slots")
        principal = ctx.principal(request)
        served = ctx.served()
        entries = await run_in_threadpool(compat.slots, served)
        return slot_view(entries, principal, exact=served.cache_report == "exact")

    @router.post("/slots/{id_slot}")
    async def slot_action(request: Request) -> dict[str, Any]:
        """llama-server's slot actions: ``?action=save|restore|erase`` (``{"filename"}`` for
        save and restore; 501 without ``--slot-save-path``, 409 while the slot is busy; served
        with ``--no-slots`` too, as llama-server does: that flag hides the ``/slots`` listing;
        a tenant key acts on its own slots only, :mod:`llamapy.serve.routes.slot_files`)."""
        id_slot, action = path_int(request, "id_slot"), query_required(request, "action")
        body = await read_json(request) if action != "erase" else None
        return await run_in_threadpool(slot_files.slot_action, ctx.served(),
                                       ctx.slot_store, id_slot, action, body,
                                       ctx.principal(request))

    @router.get("/metrics", model=NAMED_MODEL)
    async def metrics(request: Request) -> Response:
        """Prometheus metrics (501 with ``--no-metrics``; 403 for a tenant key)."""
        ctx.check_enabled("metrics")
        ctx.check_admin(request, "/metrics")
        text = await run_in_threadpool(ctx.metrics.render)
        return Response(text, media_type=PROMETHEUS_TEXT,
                        headers={"Process-Start-Time-Unix": str(PROCESS_START)})
