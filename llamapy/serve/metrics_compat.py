"""llama-server's ``llamacpp:`` metric names, read from the same engine stats as ours, so
dashboards and alerts written for llama-server work unchanged. ``PROCESS_START`` is the
``Process-Start-Time-Unix`` header llama-server puts on ``/metrics``."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["PROCESS_START", "llamacpp_families"]

#: Seconds since the epoch when the serving module was loaded (the process's start, closely).
PROCESS_START = int(time.time())

#: ``llamacpp:<name>_total`` counters: name -> (stats key, help).
COUNTERS = {
    "prompt_tokens": ("num_prefill_tokens", "Number of prompt tokens processed."),
    "tokens_predicted": ("num_generated_tokens", "Number of generation tokens processed."),
    "n_decode": ("num_decode_calls", "Total number of llama_decode() calls"),
    "spec_decode_num_draft_tokens": ("num_draft_tokens",
                                     "Speculative: Total draft tokens generated"),
    "spec_decode_num_accepted_tokens": ("num_draft_accepted",
                                        "Speculative: Total draft tokens accepted by the target "
                                        "model"),
    "spec_decode_num_drafts": ("num_draft_steps",
                               "Speculative: Total speculative decoding verification steps"),
}
#: ``llamacpp:<name>`` gauges: name -> (stats key, help).
GAUGES = {
    "requests_processing": ("slots_active", "Number of requests processing."),
    "requests_deferred": ("queue_depth", "Number of requests deferred."),
}


def llamacpp_families(stats: Mapping[str, Any]) -> Iterator[Metric]:
    """llama-server's metric families from the engine's stats (the engine collector of
    :mod:`llamapy.serve.metrics` yields them after its own)."""
    for name, (key, doc) in COUNTERS.items():
        yield CounterMetricFamily(f"llamacpp:{name}", doc, value=float(stats.get(key, 0)))
    for name, (key, doc) in GAUGES.items():
        yield GaugeMetricFamily(f"llamacpp:{name}", doc, value=float(stats.get(key, 0)))
    per_pos = stats.get("draft_accepted_per_pos") or ()
    if per_pos:  # llama-server writes this family only once a draft was accepted
        family = CounterMetricFamily("llamacpp:spec_decode_num_accepted_tokens_per_pos",
                                     "Accepted tokens per draft position", labels=["position"])
        for position, count in enumerate(per_pos):
            family.add_metric([str(position)], float(count))
        yield family
