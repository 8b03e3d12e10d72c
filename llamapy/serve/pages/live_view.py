"""The live view's feed: ``GET /v1/llamapy/events``, server-sent events of server snapshots.

Each connected client gets one snapshot about once a second (:data:`INTERVAL_S`), made by
:func:`snapshot` from the sources ``/slots`` and ``/metrics`` read: the engine's
:meth:`~llamapy.server.Server.stats` (slots through
:func:`~llamapy.openai_api.llama_compat.slot_entries`, exactly as ``/slots`` shows them; the
counters ``/metrics`` exports) and the app's time-to-first-token histogram. Counters stay
cumulative: a viewer derives rates (tokens/s, reuse by source per second) from two snapshots.

Nothing runs while nobody watches: there is no background task, each connection's generator
makes its own snapshots and ends when its client goes away (:class:`Watchers` counts them, and
each snapshot says how many there are). The route is behind the API key like every other (a
browser sends ``Authorization`` through a streaming ``fetch``, as ``EventSource`` cannot). With
several models ``?model=`` picks one (none: the first; unknown: 404 before the stream starts);
it is peeked at without a lease, so a model not loaded reports its state and no slots instead
of being loaded, and watching it never keeps it loaded. Each snapshot also counts each tenant's
own requests (:data:`TENANT_SECTIONS`, from the engine's
:mod:`~llamapy.engine.tenant_counts`): when keys carry tenants, a tenant key sees those of its
own tenant in place of the server's totals, and other tenants' slots bare
(:mod:`llamapy.serve.pages.tenant_view`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ...errors import LlamapyError, NotReadyError
from ...openai_api import ServedModel
from ...openai_api.llama_compat import slot_entries
from ..context import AppContext
from ..metrics.registry import REUSE_SOURCES, Metrics
from ..routing import Router
from ..sse import EventStreamResponse, encode
from .tenant_view import feed_view

__all__ = ["INTERVAL_S", "Watchers", "events_router", "snapshot"]

#: Seconds between two snapshots of one stream.
INTERVAL_S = 1.0
#: Seconds a snapshot waits for the engine's tick thread.
STATS_TIMEOUT_S = 5.0
#: Latest instability events a snapshot carries.
RECENT_EVENTS = 5

#: Snapshot sections of engine stats: section -> {field: stats key}.
SECTIONS = {
    "tokens": {"prompt": "num_prompt_tokens", "prefill": "num_prefill_tokens",
               "generated": "num_generated_tokens"},
    "requests": {"submitted": "num_submitted", "finished": "num_finished",
                 "cancelled": "num_cancelled", "rejected": "num_rejected",
                 "errors": "num_errors"},
    "ram_cache": {"bytes": "ram_cache_bytes", "budget_bytes": "ram_cache_budget_bytes",
                  "entries": "ram_cache_entries", "evictions": "ram_cache_evictions",
                  "restores": "num_ram_restores", "pinned_bytes": "ram_cache_pinned_bytes"},
    "disk_cache": {"bytes": "disk_cache_bytes", "budget_bytes": "disk_cache_budget_bytes",
                   "entries": "disk_cache_entries", "evictions": "disk_cache_evictions",
                   "restores": "num_disk_restores", "writes": "num_disk_writes"},
    "events": {"instability": "num_instability_events",
               "checkpoint_restores": "num_checkpoint_restores",
               "kv_pressure": "num_kv_pressure_events", "purged_slots": "num_purged_slots",
               "context_overflows": "num_context_overflows"},
}
#: The sections counted for each tenant's own requests (engine stats ``tenants``), with its
#: ``reused`` tokens by source, its ``ttft`` and its ``queue_depth`` (its requests waiting).
TENANT_SECTIONS = ("tokens", "requests")

#: Engine settings a snapshot repeats (for the view's axes and labels).
SETTINGS = ("n_parallel", "n_ctx", "n_ctx_seq", "max_queue", "queue_depth")


@dataclass(slots=True)
class Watchers:
    """How many clients watch the feed now (touched on the event loop only)."""

    count: int = 0


def snapshot(served: ServedModel, metrics: Metrics) -> dict[str, Any]:
    """One model's snapshot: state, ``cache_report``, settings, ``/slots``-shaped slots,
    cumulative counters by section (reuse by source under ``reused``) and the TTFT histogram's
    ``sum_s``/``count``."""
    stats = served.server.stats(STATS_TIMEOUT_S)
    out: dict[str, Any] = {"model": served.name, "state": stats.get("state", "loading"),
                           "cache_report": served.cache_report}
    out.update({key: int(stats.get(key, 0)) for key in SETTINGS})
    out["slots"] = slot_entries(served, stats.get("slots") or ())
    out["reused"] = {source: int(stats.get(f"num_reused_{source}", 0))
                     for source in REUSE_SOURCES}
    for section, keys in SECTIONS.items():
        out[section] = {name: int(stats.get(key, 0)) for name, key in keys.items()}
    out["recent_instability"] = list(stats.get("instability_events") or ())[-RECENT_EVENTS:]
    out["ttft"] = _ttft(metrics, served.name)
    out["by_tenant"] = {row.get("tenant"): tenant_sections(row)
                        for row in stats.get("tenants") or ()}
    return out


def tenant_sections(counts: Mapping[str, Any]) -> dict[str, Any]:
    """One tenant's own counters (a row of the engine stats' ``tenants``) as the snapshot's
    sections: :data:`TENANT_SECTIONS`, ``reused`` by source, ``ttft`` (the engine's time to
    first token of its requests) and ``queue_depth``."""
    out: dict[str, Any] = {section: {name: int(counts.get(key, 0))
                                     for name, key in SECTIONS[section].items()}
                           for section in TENANT_SECTIONS}
    out["reused"] = {source: int(counts.get(f"num_reused_{source}", 0))
                     for source in REUSE_SOURCES}
    out["ttft"] = {"sum_s": float(counts.get("ttft_sum_s", 0.0)),
                   "count": float(counts.get("ttft_count", 0))}
    out["queue_depth"] = int(counts.get("num_queued", 0))
    return out


def _ttft(metrics: Metrics, model_name: str) -> dict[str, float]:
    """The model's time-to-first-token histogram so far (the one ``/metrics`` exports)."""
    labels = {"model_name": model_name}
    read = metrics.registry.get_sample_value
    return {"sum_s": read("vllm:time_to_first_token_seconds_sum", labels) or 0.0,
            "count": read("vllm:time_to_first_token_seconds_count", labels) or 0.0}


def frame(ctx: AppContext, model: str | None, watchers: int) -> dict[str, Any]:
    """The event a watcher gets: the time, the watcher count, the model's snapshot (or its
    state and no slots while it is not loaded: ``loading``, ``sleeping`` under
    ``--sleep-idle-seconds``) and, with several models, each one's state."""
    head: dict[str, Any] = {"time": time.time(), "watchers": watchers}
    states = ctx.source.model_states()
    if states:
        head["models"] = states
    with ctx.steady() as asleep:  # --sleep-idle-seconds unloaded it; watching never wakes it
        if asleep:
            return {**head, "model": ctx.model_name(), "state": "sleeping", "slots": []}
        return {**head, **_loaded_view(ctx, model)}


def _loaded_view(ctx: AppContext, model: str | None) -> dict[str, Any]:
    """The model's snapshot, or its state while it is not loaded."""
    try:
        return _model_view(ctx, model)
    except NotReadyError:
        return {"model": ctx.model_name(), "state": "loading", "slots": []}
    except LlamapyError as exc:  # closing, or the tick thread busy past the timeout
        return {"model": ctx.model_name(), "state": f"unavailable: {exc}", "slots": []}


def _model_view(ctx: AppContext, model: str | None) -> dict[str, Any]:
    """The snapshot of the app's model, or of the requested one of several if loaded."""
    served = ctx.source.peek(model)
    if served is not None:
        return snapshot(served, ctx.metrics)
    name, state = ctx.source.state_of(model)
    return {"model": name, "state": state, "slots": []}


async def _feed(request: Request, ctx: AppContext, model: str | None,
                watchers: Watchers) -> AsyncGenerator[dict[str, Any], None]:
    """Snapshots every :data:`INTERVAL_S` until the client goes away, as the request's key
    sees them (:func:`~llamapy.serve.pages.tenant_view.feed_view`)."""
    principal = ctx.principal(request)
    watchers.count += 1
    try:
        while not await request.is_disconnected():
            view = await run_in_threadpool(frame, ctx, model, watchers.count)
            yield feed_view(view, principal, exact=view.get("cache_report", "exact") == "exact")
            await asyncio.sleep(INTERVAL_S)
    finally:
        watchers.count -= 1


def events_router(ctx: AppContext) -> Router:
    """``/v1/llamapy/events`` (behind the API key; see the module)."""
    router = Router(checks=[ctx.check_key])
    watchers = Watchers()

    @router.get("/v1/llamapy/events")
    async def events(request: Request) -> Response:
        """A snapshot of the slots, queue and caches about once a second (SSE), while the
        client stays; ``?model=`` picks one of several models."""
        model = request.query_params.get("model")
        ctx.source.check_named(model)  # an unknown model is a 404 now, not a broken stream
        feed = _feed(request, ctx, model, watchers)
        return EventStreamResponse(_encoded(feed), feed)

    return router


async def _encoded(feed: AsyncGenerator[Mapping[str, Any], None]
                   ) -> AsyncGenerator[bytes, None]:
    async for item in feed:
        yield encode(item)
