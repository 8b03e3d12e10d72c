"""Models, embeddings, and llama-server's extras: tokenize, detokenize, apply-template, props,
slots, health, metrics."""

from __future__ import annotations

import base64
import time

import httpx
import numpy as np
import openai
from http_helpers import MODEL_ALIAS, chat, wait_slots_free


def test_models(client: openai.OpenAI, http: httpx.Client) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_ALIAS]
    assert client.models.retrieve(MODEL_ALIAS).id == MODEL_ALIAS
    assert http.get("/v1/models/other").status_code == 404


def test_embeddings(client: openai.OpenAI) -> None:
    texts = ["The cat sat on the mat.", "A cat was sitting on a rug.",
             "Quarterly revenue grew by four percent."]
    result = client.embeddings.create(model=MODEL_ALIAS, input=texts,
                                      encoding_format="float")
    vectors = np.array([d.embedding for d in result.data])
    assert [d.index for d in result.data] == [0, 1, 2]
    assert vectors.shape[0] == 3 and vectors.shape[1] > 100
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > similarity[0, 2]
    assert result.usage.prompt_tokens > 10
    single = client.embeddings.create(model=MODEL_ALIAS, input=texts[0],
                                      encoding_format="float")
    assert np.allclose(single.data[0].embedding, vectors[0], atol=1e-4)


def test_embeddings_base64_and_token_input(http: httpx.Client) -> None:
    text = "hello world"
    ids = http.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
    floats = http.post("/v1/embeddings", json={"input": text}).json()["data"][0]["embedding"]
    encoded = http.post("/v1/embeddings",
                        json={"input": [ids], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, floats, atol=1e-5)


def test_tokenize_detokenize_round_trip(http: httpx.Client) -> None:
    text = "Hello, wörld! <|im_start|>"
    tokens = http.post("/tokenize", json={"content": text}).json()["tokens"]
    assert http.post("/detokenize", json={"tokens": tokens}).json()["content"] == text
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()
    assert [p["id"] for p in pieces["tokens"]] == tokens
    assert "<|im_start|>" in [p["piece"] for p in pieces["tokens"]]
    unparsed = http.post("/tokenize", json={"content": text, "parse_special": False}).json()
    assert len(unparsed["tokens"]) > len(tokens)


def test_apply_template(http: httpx.Client) -> None:
    prompt = http.post("/apply-template", json={"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"}]}).json()["prompt"]
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                      "<|im_end|>\n<|im_start|>assistant\n")


def test_props_and_slots(http: httpx.Client) -> None:
    props = http.get("/props").json()
    assert props["total_slots"] == 4
    assert props["default_generation_settings"]["n_ctx"] == 4096
    assert "temp" in props["default_generation_settings"]["params"]
    assert "<|im_start|>" in props["chat_template"]
    slots = wait_slots_free(http)
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert all(s["state"] in ("idle", "leased") for s in slots)


def test_health_and_metrics(http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    system = "You are a librarian. " * 12
    for question in ("Where are the maps?", "Where are the atlases?"):
        body = chat(question, max_tokens=2)
        body["messages"].insert(0, {"role": "system", "content": system})
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    text = http.get("/metrics").text
    assert 'llamapy_http_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    for name in ("llamapy_time_to_first_token_seconds_bucket",
                 "llamapy_time_per_output_token_seconds_bucket", "llamapy_queue_depth",
                 'llamapy_slots{state="idle"}', "llamapy_ram_cache_bytes",
                 "llamapy_ram_cache_entries", "llamapy_ram_cache_evictions_total",
                 "llamapy_instability_events_total", "llamapy_prompt_tokens_total",
                 "llamapy_generated_tokens_total"):
        assert name in text, name
    reused = {line.split("}")[0].split('"')[1]: float(line.split()[-1])
              for line in text.splitlines() if line.startswith("llamapy_reused_tokens_total{")}
    assert set(reused) == {"own", "donor", "ram", "disk", "inflight"}
    assert sum(reused.values()) > 0


def test_metrics_carry_llama_servers_names_and_start_time(http: httpx.Client) -> None:
    """Dashboards written for llama-server read ``llamacpp:`` names and the start header."""
    assert http.post("/v1/chat/completions", json=chat("Hi", max_tokens=3)).status_code == 200
    response = http.get("/metrics")
    started = int(response.headers["Process-Start-Time-Unix"])
    assert 0 < time.time() - started < 24 * 3600
    values = {line.split()[0]: float(line.split()[1]) for line in response.text.splitlines()
              if line.startswith("llamacpp:")}
    assert values["llamacpp:tokens_predicted_total"] >= 3
    assert values["llamacpp:prompt_tokens_total"] > 0 and values["llamacpp:n_decode_total"] > 0
    assert values["llamacpp:requests_processing"] == 0
    assert values["llamacpp:requests_deferred"] == 0


def test_chat_page_is_served(http: httpx.Client) -> None:
    page = http.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert '"static/chat.js"' in page.text  # relative: the pages work under --api-prefix
    stream = http.get("/static/chat-stream.js")
    assert stream.status_code == 200 and '"v1/chat/completions"' in stream.text
    dashboard = http.get("/dashboard")
    assert dashboard.status_code == 200 and '"static/dashboard.js"' in dashboard.text
    assert '"v1/llamapy/events"' in http.get("/static/dashboard.js").text
