"""Every error case answers in the OpenAI shape with the status of its type, and the server
keeps serving afterwards."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from http_helpers import MODEL_ALIAS, WAIT_S, chat
from live import LiveApp
from starlette.requests import Request

from llamapy.errors import TemplateError
from llamapy.serve import create_app
from llamapy.server import Server


def error_of(response: httpx.Response, status: int) -> dict:
    """The ``error`` object of a response, checking its status and shape."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["message"]
    return error


@pytest.mark.parametrize(("content", "param"), [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 5}', "temperature"),
    (b'{"messages": "hi"}', "messages"),
])
def test_malformed_or_invalid_bodies_are_400(http: httpx.Client, content: bytes,
                                              param: str | None) -> None:
    response = http.post("/v1/chat/completions", content=content,
                         headers={"Content-Type": "application/json"})
    error = error_of(response, 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_unknown_field_streamed_n_and_bad_tool_choice_are_400(http: httpx.Client) -> None:
    error = error_of(http.post("/v1/chat/completions", json=chat("hi", temprature=1)), 400)
    assert (error["param"], error["code"]) == ("temprature", "unknown_parameter")
    error = error_of(http.post("/v1/completions", json={"prompt": "hi", "n": 2,
                                                        "stream": True}), 400)
    assert (error["param"], error["code"]) == ("n", "unsupported_feature")
    error_of(http.post("/v1/chat/completions", json=chat("hi", tool_choice="required")), 400)
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    error_of(http.post("/v1/chat/completions", json={"messages": [image]}), 400)


def test_bad_prompts_are_400(http: httpx.Client) -> None:
    for prompt in ([12, None, 7], [], [[99999999]], [1.5]):  # [12, "text", 7] is a prompt
        error = error_of(http.post("/completion", json={"prompt": prompt}), 400)
        assert error["param"] == "prompt"
    error_of(http.post("/v1/completions", json={"prompt": [[1, 2], [99999999]]}), 400)
    error_of(http.post("/detokenize", json={"tokens": [-1]}), 400)
    error_of(http.post("/v1/embeddings", json={"input": ""}), 400)
    error_of(http.post("/v1/embeddings", json={"input": "x", "encoding_format": "hex"}), 400)


def test_bad_grammar_and_unsupported_schema_are_400(http: httpx.Client) -> None:
    error = error_of(http.post("/v1/chat/completions", json=chat("hi", grammar="root ::= (")),
                     400)
    assert error["type"] == "invalid_request_error"
    schema = {"type": "string", "pattern": "^a+$"}
    body = chat("hi", response_format={"type": "json_schema",
                                       "json_schema": {"name": "x", "schema": schema}})
    error = error_of(http.post("/v1/chat/completions", json=body), 400)
    assert "pattern" in error["message"]


def test_unknown_model_and_route_are_404(client: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", max_tokens=1,
                                       messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert "--accept-any-model" in info.value.body["message"]  # type: ignore[index]
    error_of(http.get("/v2/nothing"), 404)
    error_of(http.post("/v1/embeddings", json={"input": "x", "model": "other"}), 404)


def test_accept_any_model_answers_clients_that_hard_code_a_name(server: Server) -> None:
    """Many clients send ``gpt-3.5-turbo``: ``--accept-any-model`` serves them (llama-server
    answers any name); the default stays a 404, as in vLLM."""
    with LiveApp(create_app(server, alias=MODEL_ALIAS, accept_any_model=True)) as app:
        client = openai.OpenAI(base_url=app.url + "/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="gpt-3.5-turbo", max_tokens=2,
                                               messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content is not None


def test_context_overflow_is_400_with_token_counts(http: httpx.Client) -> None:
    body = chat("word " * 5000, max_tokens=4)
    error = error_of(http.post("/v1/chat/completions", json=body), 400)
    assert error["code"] == "context_length_exceeded"
    assert error["n_ctx"] == 4096 and error["additional_tokens"] > 4096 - error["resident_tokens"]
    streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
    assert error_of(streamed, 400)["code"] == "context_length_exceeded"
    assert http.post("/v1/chat/completions", json=chat("hi", max_tokens=2)).status_code == 200


@pytest.fixture(scope="module")
def strict(server: Server) -> Iterator[LiveApp]:
    """An app on the shared server with an API key and a 2 KB body limit."""
    with LiveApp(create_app(server, alias=MODEL_ALIAS, api_key="sekret",
                            max_body_bytes=2048)) as app:
        yield app


def test_api_key(strict: LiveApp) -> None:
    with httpx.Client(base_url=strict.url, timeout=60) as http:
        error = error_of(http.post("/v1/chat/completions", json=chat("hi", max_tokens=1)), 401)
        assert error["code"] == "invalid_api_key"
        wrong = {"Authorization": "Bearer nope"}
        error_of(http.get("/v1/models", headers=wrong), 401)
        error_of(http.get("/metrics"), 401)
        assert http.get("/health").status_code == 200
        good = {"Authorization": "Bearer sekret"}
        assert http.get("/slots", headers=good).status_code == 200
    bad_client = openai.OpenAI(base_url=strict.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_client.models.list()
    good_client = openai.OpenAI(base_url=strict.url + "/v1", api_key="sekret", max_retries=0)
    assert good_client.models.list().data[0].id == MODEL_ALIAS


def test_body_too_large_is_413(strict: LiveApp) -> None:
    headers = {"Authorization": "Bearer sekret", "Content-Type": "application/json"}
    body = b'{"messages": [{"role": "user", "content": "' + b"x" * 4000 + b'"}]}'
    with httpx.Client(base_url=strict.url, timeout=60, headers=headers) as http:
        error = error_of(http.post("/v1/chat/completions", content=body), 413)
        assert error["code"] == "payload_too_large"

        def chunked() -> Iterator[bytes]:  # no Content-Length: counted while reading
            yield body[:1000]
            yield body[1000:]

        error_of(http.post("/v1/chat/completions", content=chunked()), 413)
        assert http.post("/v1/chat/completions", json=chat("hi", max_tokens=1)).status_code == 200


def test_queue_full_is_429_with_retry_after(model_path: Path) -> None:
    # (the long answer's budget is its time on the slot: the queued request must arrive
    # within it even on a loaded machine; closing its stream ends it early)
    with Server(model_path, n_ctx=4096, n_parallel=1, max_queue=1, n_threads=1) as server, \
            LiveApp(create_app(server)) as live, \
            httpx.Client(base_url=live.url, timeout=60) as http:
        server.wait_ready(60)
        end_ids = [server.model.eos, server.model.eot]
        long = {"messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 3500, "stream": True,  # no end of generation: stays busy
                "logit_bias": {str(t): False for t in end_ids if t >= 0}}
        with http.stream("POST", "/v1/chat/completions", json=long) as running:
            lines = running.iter_lines()  # keep it: a dropped iterator closes the stream
            next(lines)  # the only slot is busy
            queued = threading.Thread(target=http.post, args=("/v1/chat/completions",),
                                      kwargs={"json": chat("hi", model=None, max_tokens=1)})
            queued.start()
            deadline = time.monotonic() + WAIT_S
            while server.stats()["queue_depth"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            rejected = http.post("/v1/chat/completions", json=chat("hi", model=None))
            error = error_of(rejected, 429)
            assert rejected.headers["Retry-After"] == "1"
            assert error["type"] == "rate_limit_error"
            streamed = http.post("/v1/chat/completions",
                                 json=chat("hi", model=None, stream=True))
            error_of(streamed, 429)
        queued.join(WAIT_S)
        assert not queued.is_alive()
        assert http.get("/health").status_code == 200


def test_unexpected_error_is_500_and_the_server_stays_up(server: Server) -> None:
    app = create_app(server, alias=MODEL_ALIAS)

    async def boom(request: Request) -> None:
        raise RuntimeError("kaput")

    app.add_route("/boom", boom)

    with LiveApp(app) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        error = error_of(http.get("/boom"), 500)
        assert error["type"] == "server_error" and "kaput" in error["message"]
        assert http.get("/health").status_code == 200
        assert http.post("/v1/chat/completions", json=chat("hi", max_tokens=1)).status_code == 200


def test_template_errors_are_400_with_the_template_message(server: Server) -> None:
    template = ("{% for m in messages %}{% if m.content == 'boom' %}"
                "{{ raise_exception('boom is not supported') }}{% endif %}"
                "{{ m.content }}{% endfor %}")
    with LiveApp(create_app(server, chat_template=template)) as live, \
            httpx.Client(base_url=live.url, timeout=60) as http:
        body = {"messages": [{"role": "user", "content": "boom"},
                             {"role": "user", "content": "hi"}]}
        error = error_of(http.post("/v1/chat/completions", json=body), 400)
        assert "boom is not supported" in error["message"]
        assert error["code"] == "chat_template_error"
        ok = http.post("/v1/chat/completions", json={**body, "messages": body["messages"][1:],
                                                     "max_tokens": 1})
        assert ok.status_code == 200
    with pytest.raises(TemplateError):
        create_app(server, chat_template="{% for %}")


def test_cors_allows_configured_origins_only(server: Server) -> None:
    app = create_app(server, alias=MODEL_ALIAS, cors_origins=["http://ui.example"])
    with LiveApp(app) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        preflight = http.options("/v1/chat/completions", headers={
            "Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://ui.example"
        response = http.post("/v1/chat/completions", json=chat("hi", max_tokens=1),
                             headers={"Origin": "http://ui.example"})
        assert response.headers["access-control-allow-origin"] == "http://ui.example"
        assert "x-llamapy-cache-tokens" in response.headers["access-control-expose-headers"].lower()
        other = http.get("/health", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers
