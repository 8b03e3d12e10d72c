"""vLLM's metric names for gateways (llm-d, KEDA, vLLM's dashboards), checked with
prometheus_client's own parser against what the requests did."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from http_helpers import MODEL_ALIAS
from prometheus_client.parser import text_string_to_metric_families

from llamapy.serve.metrics.gateway import kv_cache_usage

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "llamapy-cache.json"


def samples(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = http.get("/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found: dict, name: str, **labels: str) -> float:
    """A sample's value (0 for a labelled series not observed yet)."""
    return found.get((name, tuple(sorted({"model_name": MODEL_ALIAS, **labels}.items()))), 0.0)


def test_vllm_names_follow_the_requests(http: httpx.Client) -> None:
    before = samples(http)
    prompt = "The capital of France is Paris. The capital of Italy is"
    for _ in range(2):  # the second request reuses the first one's prompt KV
        done = http.post("/v1/completions", json={"model": MODEL_ALIAS, "prompt": prompt,
                                                  "max_tokens": 4, "temperature": 0})
        assert done.status_code == 200, done.text
    after = samples(http)
    assert ("vllm:num_requests_running", (("model_name", MODEL_ALIAS),)) in after
    queries = value(after, "vllm:prefix_cache_queries_total") - \
        value(before, "vllm:prefix_cache_queries_total")
    hits = value(after, "vllm:prefix_cache_hits_total") - \
        value(before, "vllm:prefix_cache_hits_total")
    prompt_tokens = done.json()["usage"]["prompt_tokens"]
    assert queries == 2 * prompt_tokens
    assert prompt_tokens - 1 <= hits <= queries
    ttft = value(after, "vllm:time_to_first_token_seconds_count") - \
        value(before, "vllm:time_to_first_token_seconds_count")
    e2e = value(after, "vllm:e2e_request_latency_seconds_count") - \
        value(before, "vllm:e2e_request_latency_seconds_count")
    assert ttft == e2e == 2
    assert value(after, "vllm:inter_token_latency_seconds_count") >= 2
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:num_requests_waiting") == 0
    assert 0 < value(after, "vllm:kv_cache_usage_perc") <= 1


def test_kv_cache_usage_is_a_share_of_the_context() -> None:
    stats = {"n_ctx": 100, "slots": [{"cached_tokens": 30}, {"cached_tokens": 20}]}
    assert kv_cache_usage(stats) == 0.5
    assert kv_cache_usage({"n_ctx": 10, "slots": [{"cached_tokens": 30}]}) == 1.0
    assert kv_cache_usage({}) == 0.0


def test_the_grafana_dashboard_reads_only_metrics_we_export(http: httpx.Client) -> None:
    done = http.post("/v1/chat/completions", json={
        "model": MODEL_ALIAS, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
        "speculative": "ngram"})
    assert done.status_code == 200, done.text
    exported = {name for name, _ in samples(http)}
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for expr in exprs for m in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr)}
    assert len(dashboard["panels"]) >= 6 and used
    assert used <= exported, used - exported


def plain(found: dict, name: str) -> float:
    """An unlabelled sample's value (llama-server's names carry no labels)."""
    return float(found[(name, ())])


def test_llama_servers_time_metrics(http: httpx.Client) -> None:
    done = http.post("/completion", json={"prompt": "I believe", "n_predict": 8,
                                          "cache_prompt": False, "ignore_eos": True}).json()
    assert done["tokens_predicted"] == 8
    found = samples(http)  # this scrape closes the window holding that request
    assert plain(found, "llamacpp:predicted_tokens_seconds") > 0
    assert plain(found, "llamacpp:prompt_tokens_seconds") > 0
    assert plain(found, "llamacpp:tokens_predicted_seconds_total") >= (
        done["timings"]["predicted_ms"] / 1000.0 - 1e-9)
    assert plain(found, "llamacpp:prompt_seconds_total") > 0
    assert plain(found, "llamacpp:n_tokens_max") >= done["tokens_evaluated"] + 8
    assert plain(found, "llamacpp:n_busy_slots_per_decode") >= 1.0
    assert plain(found, "llamacpp:prompt_tokens_cached_total") >= 0
    again = samples(http)  # nothing finished since: an empty window
    assert plain(again, "llamacpp:predicted_tokens_seconds") == 0.0
    assert plain(again, "llamacpp:prompt_tokens_seconds") == 0.0
