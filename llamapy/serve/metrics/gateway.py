"""The metric names gateways and dashboards already read (vLLM's ``vllm:*``), beside ours.

The Gateway API Inference Extension (llm-d's endpoint picker), KEDA scalers and vLLM's Grafana
dashboards read ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (in
tokens, as vLLM counts them) and the ``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds`` and ``vllm:e2e_request_latency_seconds`` histograms, each
with a ``model_name`` label. The gauges and counters are read from the engine's stats at scrape
time (the engine collector yields them); the histograms are observed from each response's
``timings``.

``kv_cache_usage_perc`` is the share of the context's cells the slots' cached tokens take (an
upper bound when slots share a prefix's cells), in [0, 1] as vLLM reports it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["GatewayHistograms", "gateway_families", "kv_cache_usage"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)

#: ``vllm:<name>`` gauges: name -> (stats key, help).
GAUGES = {
    "num_requests_running": ("slots_active", "Number of requests in model execution batches."),
    "num_requests_waiting": ("queue_depth", "Number of requests waiting to be processed."),
}
#: ``vllm:<name>_total`` counters: name -> (stats key, help).
COUNTERS = {
    "prefix_cache_queries": ("num_prompt_tokens",
                             "Prefix cache queries, in terms of number of queried tokens."),
    "prefix_cache_hits": ("num_reused_tokens",
                          "Prefix cache hits, in terms of number of cached tokens."),
}


def kv_cache_usage(stats: Mapping[str, Any]) -> float:
    """The share of KV cells held by the slots' cached tokens, in [0, 1]."""
    n_ctx = float(stats.get("n_ctx") or 0)
    cached = sum(int(slot.get("cached_tokens", 0)) for slot in stats.get("slots") or ())
    return min(1.0, cached / n_ctx) if n_ctx > 0 else 0.0


def gateway_families(stats: Mapping[str, Any], model_name: str) -> Iterator[Metric]:
    """vLLM's gauges and counters from the engine's stats, labelled with ``model_name``."""
    for name, (key, doc) in GAUGES.items():
        gauge = GaugeMetricFamily(f"vllm:{name}", doc, labels=["model_name"])
        gauge.add_metric([model_name], float(stats.get(key, 0)))
        yield gauge
    usage = GaugeMetricFamily("vllm:kv_cache_usage_perc",
                              "KV-cache usage. 1 means 100 percent usage.", labels=["model_name"])
    usage.add_metric([model_name], kv_cache_usage(stats))
    yield usage
    for name, (key, doc) in COUNTERS.items():
        counter = CounterMetricFamily(f"vllm:{name}", doc, labels=["model_name"])
        counter.add_metric([model_name], float(stats.get(key, 0)))
        yield counter


class GatewayHistograms:
    """vLLM's latency histograms, observed from each response's ``timings``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", labels,
                              buckets=_LATENCY_BUCKETS, registry=registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", labels,
                             buckets=_TOKEN_BUCKETS, registry=registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", labels,
                             buckets=_E2E_BUCKETS, registry=registry)

    def observe(self, timings: Mapping[str, Any], model_name: str) -> None:
        """Record one response from its ``ttft_ms`` (from submission, queueing included),
        ``predicted_ms`` and ``predicted_per_token_ms`` (absent fields are skipped)."""
        ttft = timings.get("ttft_ms")
        if ttft is not None:
            self.ttft.labels(model_name).observe(ttft / 1000.0)
            decode = timings.get("predicted_ms") or 0.0
            self.e2e.labels(model_name).observe((ttft + decode) / 1000.0)
        per_token = timings.get("predicted_per_token_ms")
        if per_token is not None and timings.get("predicted_n", 0) > 1:
            self.itl.labels(model_name).observe(per_token / 1000.0)
