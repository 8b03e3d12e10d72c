"""llama-server's ``llamacpp:`` metric names, read from the same engine stats as ours, so
dashboards and alerts written for llama-server work unchanged. ``PROCESS_START`` is the
``Process-Start-Time-Unix`` header llama-server puts on ``/metrics``.

The time-based ones come from each response's ``timings`` (:class:`LlamacppTimings`):
``prompt_seconds_total`` and ``tokens_predicted_seconds_total`` sum the requests' prompt and
generation times, ``n_tokens_max`` is the longest sequence seen (prompt + generated), and the
gauges ``prompt_tokens_seconds`` / ``predicted_tokens_seconds`` are the throughput of the
requests finished since the previous scrape (each scrape starts a new window, as llama-server's
buckets do; 0 when none finished).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["PROCESS_START", "LlamacppTimings", "llamacpp_families"]

#: Seconds since the epoch when the serving module was loaded (the process's start, closely).
PROCESS_START = int(time.time())

#: ``llamacpp:<name>_total`` counters: name -> (stats key, help).
COUNTERS = {
    "prompt_tokens": ("num_prefill_tokens", "Number of prompt tokens processed."),
    "prompt_tokens_cached": ("num_reused_tokens", "Number of prompt tokens reused from cache."),
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
    :mod:`llamapy.serve.metrics.registry` yields them after its own)."""
    for name, (key, doc) in COUNTERS.items():
        yield CounterMetricFamily(f"llamacpp:{name}", doc, value=float(stats.get(key, 0)))
    for name, (key, doc) in GAUGES.items():
        yield GaugeMetricFamily(f"llamacpp:{name}", doc, value=float(stats.get(key, 0)))
    busy = float(stats.get("num_decode_slots", 0)) / max(float(stats.get("num_decode_calls", 0)),
                                                         1.0)
    yield GaugeMetricFamily("llamacpp:n_busy_slots_per_decode",
                            "Average number of busy slots per llama_decode() call", value=busy)
    per_pos = stats.get("draft_accepted_per_pos") or ()
    if per_pos:  # llama-server writes this family only once a draft was accepted
        family = CounterMetricFamily("llamacpp:spec_decode_num_accepted_tokens_per_pos",
                                     "Accepted tokens per draft position", labels=["position"])
        for position, count in enumerate(per_pos):
            family.add_metric([str(position)], float(count))
        yield family


class LlamacppTimings(Collector):
    """llama-server's time metrics from each response's ``timings`` (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = [0.0, 0.0]  # prompt s, predicted s
        self._window = [0.0, 0.0, 0.0, 0.0]  # prompt n, prompt s, predicted n, predicted s
        self._n_tokens_max = 0

    def observe(self, timings: Mapping[str, Any]) -> None:
        """Record one finished request's ``timings``."""
        prompt_s = float(timings.get("prompt_ms") or 0.0) / 1000.0
        predicted_s = float(timings.get("predicted_ms") or 0.0) / 1000.0
        predicted_n = int(timings.get("predicted_n") or 0)
        length = int(timings.get("cache_n") or 0) + int(timings.get("prompt_n") or 0)
        with self._lock:
            self._totals[0] += prompt_s
            self._totals[1] += predicted_s
            self._window[0] += int(timings.get("prompt_n") or 0)
            self._window[1] += prompt_s
            self._window[2] += max(0, predicted_n - 1)  # the first token costs no decode step
            self._window[3] += predicted_s
            self._n_tokens_max = max(self._n_tokens_max, length + predicted_n)

    def collect(self) -> Iterator[Metric]:
        """The families; the throughput window restarts."""
        with self._lock:
            totals, window, longest = list(self._totals), self._window, self._n_tokens_max
            self._window = [0.0, 0.0, 0.0, 0.0]
        yield CounterMetricFamily("llamacpp:prompt_seconds", "Prompt process time",
                                  value=totals[0])
        yield CounterMetricFamily("llamacpp:tokens_predicted_seconds",
                                  "Total time spent generating tokens", value=totals[1])
        yield GaugeMetricFamily("llamacpp:n_tokens_max", "Largest observed sequence length "
                                "(prompt + generation)", value=float(longest))
        yield GaugeMetricFamily("llamacpp:prompt_tokens_seconds",
                                "Average prompt throughput in tokens/s",
                                value=window[0] / window[1] if window[1] > 0 else 0.0)
        yield GaugeMetricFamily("llamacpp:predicted_tokens_seconds",
                                "Average generation throughput in tokens/s",
                                value=window[2] / window[3] if window[3] > 0 else 0.0)
