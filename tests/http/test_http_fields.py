"""Fields and bad input (issue 10): hostile bodies are 400s in the OpenAI shape and the server
keeps serving; ``logit_bias`` in every llama-server form on the real model."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from http_helpers import MODEL_ALIAS, chat
from live import LiveApp

from llamapy.errors import InvalidOptionError
from llamapy.serve import create_app
from llamapy.server import Server

JSON = {"Content-Type": "application/json"}


def error_of(response: httpx.Response, param: str | None = None) -> dict:
    """The 400 error object of a response, checking its shape (and ``param`` when given)."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def still_serving(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=chat("hi", max_tokens=2))
    assert response.status_code == 200 and response.json()["choices"][0]["message"]


@pytest.mark.parametrize("content", [
    b"[" * 100_000,
    b'{"messages": ' + b"[" * 100_000,
    b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}',
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"15": Infinity}}',
])
def test_hostile_json_is_400_and_the_server_stays_up(http: httpx.Client, content: bytes) -> None:
    error = error_of(http.post("/v1/chat/completions", content=content, headers=JSON))
    assert "malformed JSON" in error["message"]
    still_serving(http)


def test_lone_surrogate_is_400_on_every_route(http: httpx.Client) -> None:
    prompt = b'{"prompt": "a\\udc00b", "max_tokens": 2}'
    for path in ("/completion", "/v1/completions", "/tokenize", "/v1/embeddings"):
        body = prompt.replace(b"prompt", b"content") if path == "/tokenize" else prompt
        body = body.replace(b"prompt", b"input") if path == "/v1/embeddings" else body
        error_of(http.post(path, content=body, headers=JSON))
    valid_pair = b'{"content": "\\ud83d\\ude00"}'  # a surrogate pair is fine
    assert http.post("/tokenize", content=valid_pair, headers=JSON).json()["tokens"]
    still_serving(http)


@pytest.mark.parametrize("stream", ["yes", 1, "false", [True]])
def test_stream_must_be_a_boolean(http: httpx.Client, stream: object) -> None:
    error_of(http.post("/v1/chat/completions", json=chat("hi", stream=stream)), "stream")
    error_of(http.post("/v1/completions", json={"prompt": "hi", "stream": stream}), "stream")
    error_of(http.post("/completion", json={"prompt": "hi", "stream": stream}), "stream")
    still_serving(http)


@pytest.mark.parametrize("bias", [
    {"99999999": 1}, {"-5": 1}, [[49152, 1.0]], [[-1, False]],
    {"15": 1000}, [[15, -101]], {"15": True}, {"15": "x"}, [[15]], "x",
])
def test_bad_logit_bias_is_400(http: httpx.Client, bias: object) -> None:
    error_of(http.post("/v1/chat/completions", json=chat("hi", logit_bias=bias)), "logit_bias")
    error_of(http.post("/v1/completions", json={"prompt": "hi", "logit_bias": bias}),
             "logit_bias")
    error_of(http.post("/completion", json={"prompt": "hi", "logit_bias": bias}), "logit_bias")
    still_serving(http)


def native_tokens(http: httpx.Client, **fields: object) -> list[int]:
    """The greedy ``/completion`` tokens of a fixed prompt."""
    body = {"prompt": "The capital of France is", "n_predict": 3, "temperature": 0,
            "return_tokens": True, **fields}
    response = http.post("/completion", json=body)
    assert response.status_code == 200, response.text
    return list(response.json()["tokens"])


def test_logit_bias_forms_on_completion(http: httpx.Client) -> None:
    first = native_tokens(http)[0]
    forced = 1000 if first != 1000 else 1001
    assert native_tokens(http, logit_bias={str(forced): 100})[0] == forced
    assert native_tokens(http, logit_bias=[[forced, 100.0]])[0] == forced
    for banned in ({str(first): False}, [[first, False]], [[first, -100]]):
        assert first not in native_tokens(http, logit_bias=banned)
    piece = http.post("/detokenize", json={"tokens": [first]}).json()["content"]
    text_ids = http.post("/tokenize", json={"content": piece}).json()["tokens"]
    assert first in text_ids  # so banning the text bans the greedy token
    for banned_text in ([[piece, False]], {piece: False}):
        tokens = native_tokens(http, logit_bias=banned_text)
        assert not set(tokens) & set(text_ids), (piece, tokens)


def test_logit_bias_forms_on_the_openai_routes(http: httpx.Client) -> None:
    forced = http.post("/tokenize", json={"content": " Paris"}).json()["tokens"][0]
    body = {"prompt": "Name a city:", "max_tokens": 1, "temperature": 0}
    for bias in ({str(forced): 100}, [[forced, 100]], [[" Paris", 100]]):
        response = http.post("/v1/completions", json={**body, "logit_bias": bias})
        assert response.json()["choices"][0]["text"] == " Paris", bias
    response = http.post("/v1/chat/completions",
                         json=chat("Say hi", max_tokens=1, logit_bias={str(forced): 100}))
    assert response.json()["choices"][0]["message"]["content"].strip() == "Paris"


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", chat("word " * 5000, max_tokens=4)),
    ("/v1/completions", {"prompt": "word " * 5000, "max_tokens": 4}),
    ("/completion", {"prompt": "word " * 5000, "n_predict": 4}),
    ("/completion", {"prompt": "word " * 5000, "n_predict": 4, "stream": True}),
])
def test_context_overflow_has_llama_servers_shape(http: httpx.Client, path: str,
                                                  body: dict) -> None:
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["code"] == "context_length_exceeded"  # OpenAI clients key on this
    assert error["n_ctx"] == 4096 and error["n_prompt_tokens"] > 4096
    still_serving(http)


def preflight(http: httpx.Client, origin: str) -> httpx.Response:
    return http.options("/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_cors_preflight_for_llama_server_origin_values(server: Server) -> None:
    app = create_app(server, alias=MODEL_ALIAS, api_key="k",
                     cors_origins=["http://a.example,http://b.example", "localhost"])
    with LiveApp(app) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        for origin in ("http://a.example", "http://b.example", "http://localhost:5173",
                       "http://127.0.0.1:8080", "https://[::1]"):
            response = preflight(http, origin)  # no key: browsers send none on a preflight
            assert response.status_code == 200, (origin, response.text)
            assert response.headers["access-control-allow-origin"] == origin
            assert "POST" in response.headers["access-control-allow-methods"]
            assert "authorization" in response.headers["access-control-allow-headers"].lower()
        for origin in ("http://c.example", "http://localhost.evil.example"):
            assert "access-control-allow-origin" not in preflight(http, origin).headers
        answer = http.post("/v1/chat/completions", json=chat("hi", max_tokens=1),
                           headers={"Origin": "http://localhost:3000",
                                    "Authorization": "Bearer k"})
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_cors_by_default_allows_local_pages_only(live: LiveApp) -> None:
    with httpx.Client(base_url=live.url, timeout=60) as http:
        for origin in ("http://localhost", "http://127.0.0.1:3000", "http://[::1]:8080"):
            response = preflight(http, origin)
            assert response.status_code == 200
            assert response.headers["access-control-allow-origin"] == origin
            assert response.headers["access-control-allow-credentials"] == "true"
            assert response.headers["access-control-allow-methods"] == (
                "GET, POST, DELETE, OPTIONS")
        for origin in ("http://evil.com", "http://notlocalhost", "http://localhost.evil.com"):
            response = preflight(http, origin)  # llama-server's answer: 200, no allow-origin
            assert response.status_code == 200
            assert "access-control-allow-origin" not in response.headers
            answer = http.get("/v1/models", headers={"Origin": origin})
            assert answer.status_code == 200
            assert "access-control-allow-origin" not in answer.headers
        assert http.options("/completions").status_code == 200  # never a 405


def test_cors_any_origin_echoes_it(server: Server) -> None:
    app = create_app(server, alias=MODEL_ALIAS, cors_origins=["*"])
    with LiveApp(app) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        assert preflight(http, "http://web.mydomain.fr").headers[
            "access-control-allow-origin"] == "http://web.mydomain.fr"
        models = http.get("/v1/models", headers={"Origin": "http://web.mydomain.fr"})
        assert models.headers["access-control-allow-origin"] == "http://web.mydomain.fr"
        assert "access-control-allow-origin" not in http.get("/v1/models").headers


def test_n_chat_choices(client: openai.OpenAI) -> None:
    messages: list = [{"role": "user", "content": "Write a long story about a dragon."}]
    one = client.chat.completions.create(model=MODEL_ALIAS, messages=messages, max_tokens=4,
                                         temperature=0)
    assert one.usage is not None
    many = client.chat.completions.create(model=MODEL_ALIAS, messages=messages, max_tokens=4,
                                          temperature=0, n=3)
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert all(c.message.content for c in many.choices)
    assert all(c.finish_reason == "length" for c in many.choices)
    assert many.usage is not None
    assert many.usage.completion_tokens == 3 * one.usage.completion_tokens == 12
    assert many.usage.prompt_tokens == 3 * one.usage.prompt_tokens
    sampled = client.chat.completions.create(model=MODEL_ALIAS, messages=messages,
                                             max_tokens=12, temperature=1.5, seed=5, n=4)
    assert len({c.message.content for c in sampled.choices}) > 1  # seeds differ per choice


def test_n_completion_choices_per_prompt(http: httpx.Client) -> None:
    body = {"prompt": ["Once upon a time", "The cat"], "max_tokens": 5, "temperature": 0}
    response = http.post("/v1/completions", json={**body, "n": 2, "echo": True}).json()
    choices = response["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    prompts = ["Once upon a time"] * 2 + ["The cat"] * 2  # choice i * n + j: prompt i
    for choice, prompt in zip(choices, prompts, strict=True):
        assert choice["text"].startswith(prompt) and len(choice["text"]) > len(prompt)
        assert choice["finish_reason"] == "length"
    assert response["usage"]["completion_tokens"] == 4 * 5
    error = error_of(http.post("/v1/completions", json={**body, "n": 2, "stream": True}), "n")
    assert error["code"] == "unsupported_feature"
    error_of(http.post("/v1/chat/completions", json=chat("hi", n=129)), "n")


def test_embeddings_take_content_and_mixed_lists(http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"content": "a red apple", "add_special": True}
                    ).json()["tokens"]
    by_input = http.post("/v1/embeddings", json={"input": "a red apple"}).json()
    by_content = http.post("/v1/embeddings", json={"content": "a red apple"}).json()
    assert by_content["data"][0]["embedding"] == pytest.approx(
        by_input["data"][0]["embedding"], abs=1e-5)
    mixed = http.post("/v1/embeddings", json={"content": ["a red apple", ids, "tax law"]})
    data = mixed.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    assert data[1]["embedding"] == pytest.approx(data[0]["embedding"], abs=1e-4)
    assert data[2]["embedding"] != pytest.approx(data[0]["embedding"], abs=1e-2)
    error_of(http.post("/v1/embeddings", json={"input": "x", "content": "x"}), "input")
    error_of(http.post("/v1/embeddings", json={}), "input")
    parts = http.post("/v1/embeddings", json={"input": [
        "hello world", {"content": [{"type": "text", "text": "hello "},
                                    {"type": "text", "text": "world"}]}]}).json()["data"]
    assert parts[1]["embedding"] == pytest.approx(parts[0]["embedding"], abs=1e-4)
    for bad in ({"content": [{"type": "unknown"}]}, {"text": "x"}):
        error_of(http.post("/v1/embeddings", json={"input": [bad]}), "input")
    # an image part without its url: the media's error (this model has no projector either)
    error_of(http.post("/v1/embeddings", json={"input": [{"content": [{"type": "image_url"}]}]}))


def test_pooling_none_on_the_openai_embeddings_is_400(model_path: Path) -> None:
    with Server(model_path, n_ctx=512, n_parallel=1, n_threads=1, pooling_type="none"
                ) as server:
        server.wait_ready(60)
        with LiveApp(create_app(server)) as live, httpx.Client(base_url=live.url,
                                                                 timeout=60) as http:
            error = error_of(http.post("/v1/embeddings", json={"input": "hello hello"}))
            assert "--pooling none" in error["message"]
            done = http.post("/completion", json={"prompt": "Hello", "n_predict": 1})
            assert done.status_code == 200


@pytest.mark.parametrize("pooling", ["cls", "last"])
def test_pooling_flag_picks_the_embeddings_pooling(model_path: Path, pooling: str) -> None:
    import numpy as np

    from llamapy.embeddings import Embedder

    text = "The quick brown fox jumps over the lazy dog"
    with Server(model_path, n_ctx=512, n_parallel=1, n_threads=1, pooling_type=pooling
                ) as server:
        server.wait_ready(60)
        with LiveApp(create_app(server)) as live, httpx.Client(base_url=live.url,
                                                                 timeout=60) as http:
            got = np.array(http.post("/v1/embeddings", json={"input": text}
                                     ).json()["data"][0]["embedding"])
        with Embedder(server.model, n_threads=1, pooling=pooling) as same, \
                Embedder(server.model, n_threads=1) as mean:
            assert mean.pooling == "mean"
            assert got == pytest.approx(same.embed(text), abs=1e-4)
            assert float(np.abs(got - mean.embed(text)).max()) > 1e-2
        with pytest.raises(InvalidOptionError, match="pooling"):
            Embedder(server.model, pooling="none")


def test_props_has_llama_servers_fields(http: httpx.Client) -> None:
    props = http.get("/props").json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 4096 == http.get("/slots").json()[0]["n_ctx"]  # unified KV
    assert (settings["id"], settings["is_processing"]) == (0, False)
    assert (props["total_slots"], props["is_sleeping"]) == (4, False)
    assert props["modalities"] == {"vision": False, "audio": False, "video": False}
    assert props["build_info"].startswith("llamapy-") and "llama.cpp-" in props["build_info"]
    assert "<|im_start|>" in props["chat_template"]


def test_props_n_ctx_is_per_slot_without_a_unified_cache(model_path: Path) -> None:
    with Server(model_path, n_ctx=2048, n_parallel=2, kv_unified=False, n_threads=1) as server:
        server.wait_ready(60)
        with LiveApp(create_app(server)) as live, httpx.Client(base_url=live.url,
                                                                  timeout=120) as http:
            props = http.get("/props").json()
            assert props["default_generation_settings"]["n_ctx"] == 1024
            assert props["total_slots"] == 2
            assert [slot["n_ctx"] for slot in http.get("/slots").json()] == [1024, 1024]
            # the limit reported is the one enforced: 1500 tokens fit the context, not a slot
            over = http.post("/completion", json={"prompt": "word " * 1500, "n_predict": 2})
            error = over.json()["error"]
            assert (over.status_code, error["type"]) == (400, "exceed_context_size_error")
            assert error["n_ctx"] == 1024 and 1024 < error["n_prompt_tokens"] < 2048
            fits = http.post("/completion", json={"prompt": "word " * 600, "n_predict": 2})
            assert fits.status_code == 200, fits.text
