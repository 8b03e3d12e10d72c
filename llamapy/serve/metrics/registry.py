"""``/metrics`` in Prometheus format (``prometheus_client``, one registry per app).

HTTP-side: requests by endpoint and status, time to first token and per-output-token latency
histograms (observed from each response's timings). Engine-side, read from
:meth:`Server.stats` at scrape time: prompt/prefill/generated tokens, queue depth, slots by
state, and the cache metrics no peer exposes: reused prompt tokens by source (own slot, donor
slot, RAM cache, disk cache, in-flight), RAM and disk cache bytes/entries/evictions/restores,
disk cache writes, failures and bad files removed, prefix instability
events (a template rewriting history), KV pressure purges. llama-server's ``llamacpp:`` names
come alongside (:mod:`llamapy.serve.metrics.compat`), and vLLM's `vllm:` names for gateways
(:mod:`llamapy.serve.metrics.gateway`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .compat import LlamacppTimings, llamacpp_families
from .gateway import GatewayHistograms, gateway_families

PREFIX = "llamapy"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)

#: Engine counters exported as ``llamapy_<name>_total``: stats key -> help.
ENGINE_COUNTERS = {
    "num_prompt_tokens": "Prompt tokens of admitted requests",
    "num_prefill_tokens": "Prompt tokens computed (not reused)",
    "num_generated_tokens": "Tokens generated",
    "num_submitted": "Requests submitted to the engine",
    "num_rejected": "Requests rejected (queue full, invalid, overflow)",
    "num_cancelled": "Requests cancelled",
    "num_errors": "Requests failed",
    "num_ram_restores": "Prefixes restored from the RAM prompt cache",
    "num_ram_restore_failures": "Failed RAM prompt cache restores",
    "num_disk_writes": "Prefixes written to the disk prompt cache",
    "num_disk_restores": "Prefixes restored from the disk prompt cache",
    "num_disk_failures": "Failed disk prompt cache restores (file vanished, corrupt or refused)",
    "num_purged_slots": "Idle slot caches purged under KV pressure",
    "num_parked_slots": "Idle slot caches moved to the RAM prompt cache while others decode",
    "num_kv_pressure_events": "KV pressure events",
    "num_context_overflows": "Context overflows",
    "num_instability_events": "Prefix instability events (cached history matched 10-50%)",
    "num_checkpoints_taken": "Context checkpoints taken (models whose state cannot be trimmed)",
    "num_checkpoint_restores": "Context checkpoints restored to resume a diverging prompt",
    "num_checkpoint_tokens_behind": "Shared prompt tokens computed again past a restored "
                                    "checkpoint",
    "num_draft_tokens": "Speculative draft tokens verified",
    "num_draft_accepted": "Speculative draft tokens accepted",
    "num_draft_steps": "Speculative verification steps",
    "ram_cache_evictions": "RAM prompt cache evictions",
    "disk_cache_evictions": "Disk prompt cache evictions",
    "disk_cache_bad_files": "Corrupt or foreign disk prompt cache files removed",
}
#: Engine gauges exported as ``llamapy_<name>``.
ENGINE_GAUGES = {
    "queue_depth": "Requests waiting for a slot",
    "ram_cache_bytes": "Bytes held by the RAM prompt cache",
    "ram_cache_entries": "Entries in the RAM prompt cache",
    "ram_cache_budget_bytes": "RAM prompt cache budget in bytes",
    "ram_cache_pinned_bytes": "Bytes of RAM prompt cache entries pinned by cache_pins",
    "disk_cache_bytes": "Bytes of the disk prompt cache's files",
    "disk_cache_entries": "Files in the disk prompt cache",
    "disk_cache_budget_bytes": "Disk prompt cache budget in bytes",
    "n_parallel": "Slots",
}
REUSE_SOURCES = ("own", "donor", "ram", "disk", "inflight")
SLOT_STATES = ("idle", "leased", "prefilling", "decoding")


class EngineCollector(Collector):
    """Reads the engine's stats at scrape time (nothing while the model loads)."""

    def __init__(self, stats: Callable[[], Mapping[str, Any] | None],
                 model_name: Callable[[], str] = lambda: "") -> None:
        self._stats = stats
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        """The engine metric families."""
        stats = self._stats()
        if not stats or "num_submitted" not in stats:
            return
        for key, doc in ENGINE_COUNTERS.items():
            name = key.removeprefix("num_")
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=float(stats.get(key, 0)))
        for key, doc in ENGINE_GAUGES.items():
            yield GaugeMetricFamily(f"{PREFIX}_{key}", doc, value=float(stats.get(key, 0)))
        reused = CounterMetricFamily(f"{PREFIX}_reused_tokens",
                                     "Prompt tokens reused from cached KV, by source",
                                     labels=["source"])
        for source in REUSE_SOURCES:
            reused.add_metric([source], float(stats.get(f"num_reused_{source}", 0)))
        yield reused
        slots = GaugeMetricFamily(f"{PREFIX}_slots", "Slots by state", labels=["state"])
        for state in SLOT_STATES:
            slots.add_metric([state], float(stats.get(f"slots_{state}", 0)))
        yield slots
        finished = CounterMetricFamily(f"{PREFIX}_finished_requests",
                                       "Finished requests by finish reason", labels=["reason"])
        for reason, count in sorted(dict(stats.get("finish_reasons") or {}).items()):
            finished.add_metric([str(reason)], float(count))
        yield finished
        yield _per_position(f"{PREFIX}_draft_accepted_per_pos",
                            "Accepted speculative draft tokens by draft position", stats)
        yield from llamacpp_families(stats)
        yield from gateway_families(stats, self._model_name())


def _per_position(name: str, doc: str, stats: Mapping[str, Any]) -> Metric:
    """A counter with one series per draft position (0 = the first drafted token)."""
    family = CounterMetricFamily(name, doc, labels=["position"])
    for position, count in enumerate(stats.get("draft_accepted_per_pos") or ()):
        family.add_metric([str(position)], float(count))
    return family


class Metrics:
    """The app's registry and its HTTP-side instruments."""

    def __init__(self, stats: Callable[[], Mapping[str, Any] | None],
                 model_name: Callable[[], str] = lambda: "") -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.requests = Counter(f"{PREFIX}_http_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds",
                              "Time from submission to the first generated token",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.token_latency = Histogram(f"{PREFIX}_time_per_output_token_seconds",
                                       "Decode time per generated token after the first",
                                       buckets=_TOKEN_BUCKETS, registry=self.registry)
        self.gateway = GatewayHistograms(self.registry)
        self.llamacpp = LlamacppTimings()
        self.registry.register(EngineCollector(stats, model_name))
        self.registry.register(self.llamacpp)

    def observe(self, timings: Mapping[str, Any] | None) -> None:
        """Record a response's ``timings`` (as built by ``openai_api.report``)."""
        if not timings:
            return
        if timings.get("ttft_ms") is not None:
            self.ttft.observe(timings["ttft_ms"] / 1000.0)
        per_token = timings.get("predicted_per_token_ms")
        if per_token is not None and timings.get("predicted_n", 0) > 1:
            self.token_latency.observe(per_token / 1000.0)
        self.gateway.observe(timings, self.model_name())
        self.llamacpp.observe(timings)

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)


class RequestCounter:
    """ASGI middleware counting responses by route template and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(endpoint, str(status["code"])).inc()
