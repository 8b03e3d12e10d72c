"""/api/* on the fake backend: body validation and error shapes, NDJSON framing, option and
``keep_alive`` parsing, model names, tool calls parsed into objects, the API key, a client
that hangs up mid-stream, and ``keep_alive`` through the model manager."""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from fake_http import ALIAS, FakeApp

from llamapy.chat.layer import HERMES_TOOLS_TEMPLATE, ChatOutput, source_templates
from llamapy.engine import DoneEvent, TokenEvent
from llamapy.engine.request import RequestTimings
from llamapy.errors import InvalidOptionError, ModelNotFoundError
from llamapy.ollama_api import (
    OllamaPlan,
    OllamaStream,
    collect,
    keep_alive,
    prepare_chat_request,
    resolve_name,
    token_budget,
)
from llamapy.ollama_api.params import Message
from llamapy.ollama_api.prompt import chat_messages
from llamapy.openai_api import ServedModel
from llamapy.serve import create_app
from llamapy.server import ModelManager, ModelSpec
from llamapy.server.fake import fake_server

CHAT = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}],
        "options": {"num_predict": 4}}
STATS = {"done", "done_reason", "total_duration", "load_duration", "prompt_eval_count",
         "prompt_eval_duration", "eval_count", "eval_duration", "model", "created_at"}


def error_of(response: httpx.Response, status: int) -> str:
    """The ``error`` of an answer in Ollama's shape with ``status``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    return str(body["error"])


@pytest.mark.parametrize(("change", "field"), [
    ({"model": 7}, "model"), ({"messages": "hi"}, "messages"), ({"stream": "yes"}, "stream"),
    ({"options": {"temperature": "hot"}}, "temperature"), ({"options": {"top_k": 1.5}}, "top_k"),
    ({"options": {"num_predict": -3}}, "num_predict"), ({"options": {"stop": "x"}}, "stop"),
    ({"think": "maybe"}, "think"), ({"format": "yaml"}, "format"), ({"unknown": 1}, "unknown"),
    ({"keep_alive": [1]}, "keep_alive"), ({"options": {"top_k": -5}}, "top_k"),
    ({"options": {"seed": 2**70}}, "seed"), ({"options": {"num_ctx": 10**6}}, "num_ctx"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
    ({"top_logprobs": 99}, "top_logprobs"), ({"logprobs": "yes"}, "logprobs"),
])
def test_bad_chat_fields_are_400s_in_ollamas_shape(app: FakeApp, change: dict[str, Any],
                                                   field: str) -> None:
    error = error_of(app.send("POST", "/api/chat", json={**CHAT, **change}), 400)
    assert field in error
    app.check_idle()


@pytest.mark.parametrize("change", [{"template": "{{ .Prompt }}"}, {"suffix": "end"},
                                    {"images": ["aGk="]}])
def test_generate_refuses_what_it_does_not_do(app: FakeApp, change: dict[str, Any]) -> None:
    body = {"model": ALIAS, "prompt": "hi", **change}
    assert next(iter(change)) in error_of(app.send("POST", "/api/generate", json=body), 400)


def test_generate_returns_its_context_and_continues_from_it(app: FakeApp) -> None:
    """Ollama's ``context`` round trip: the final object holds the prompt's and the answer's
    tokens; sent back, they open the next prompt as they are (their KV reused)."""
    body = {"model": ALIAS, "prompt": "My name is Bob.", "stream": False,
            "options": {"num_predict": 3, "temperature": 0}}
    first = app.send("POST", "/api/generate", json=body).json()
    context = first["context"]
    assert len(context) > first["eval_count"] == 3
    lines = [json.loads(line) for line in
             app.send("POST", "/api/generate", json={**body, "stream": True}).text.splitlines()]
    assert [line["context"] for line in lines if "context" in line] == [context]
    second = app.send("POST", "/api/generate", json={
        **body, "prompt": "What is my name?", "context": context}).json()
    assert second["context"][:len(context)] == context
    assert len(second["context"]) > len(context) + second["eval_count"]
    assert second["prompt_eval_count"] < len(second["context"]) - second["eval_count"]
    raw = app.send("POST", "/api/generate", json={**body, "raw": True, "context": context})
    assert raw.status_code == 200 and "context" not in raw.json()  # raw ignores it (Ollama)
    assert "context" not in app.send("POST", "/api/chat", json={**CHAT, "stream": False}).json()
    app.check_idle()


@pytest.mark.parametrize("context", [[-1], ["x"], [10**9], [True], "1 2"])
def test_a_context_that_is_no_token_list_is_a_400(app: FakeApp, context: object) -> None:
    body = {"model": ALIAS, "prompt": "hi", "context": context}
    assert "context" in error_of(app.send("POST", "/api/generate", json=body), 400)
    app.check_idle()


def test_unknown_and_load_options_are_ignored_with_a_warning(
        app: FakeApp, caplog: pytest.LogCaptureFixture) -> None:
    options = {"num_predict": 2, "num_thread": 3, "made_up": True, "num_keep": 5}
    with caplog.at_level(logging.WARNING, logger="llamapy.ollama"):
        answer = app.send("POST", "/api/chat", json={**CHAT, "stream": False, "options": options})
    assert answer.status_code == 200 and answer.json()["eval_count"] == 2
    assert "made_up" in caplog.text and "num_thread" in caplog.text


def test_ndjson_lines_then_one_final_object(app: FakeApp) -> None:
    answer = app.send("POST", "/api/chat", json=CHAT)
    assert answer.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in answer.text.splitlines()]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert set(lines[-1]) >= STATS and lines[-1]["done_reason"] == "length"
    assert lines[-1]["eval_count"] == 4
    whole = app.send("POST", "/api/chat", json={**CHAT, "stream": False}).json()
    assert whole["message"]["content"] == "".join(line["message"]["content"] for line in lines)
    assert set(whole) >= STATS


def test_generate_answers_response_and_raw_skips_the_template(app: FakeApp) -> None:
    body = {"model": ALIAS, "prompt": "hi", "stream": False, "options": {"num_predict": 3}}
    chat = app.send("POST", "/api/generate", json=body).json()
    raw = app.send("POST", "/api/generate", json={**body, "raw": True}).json()
    assert isinstance(chat["response"], str) and "message" not in chat
    assert isinstance(raw["response"], str) and raw["done"] and raw["eval_count"] == 3


def test_names_with_tags_and_unknown_models(app: FakeApp) -> None:
    for name in (ALIAS, f"{ALIAS}:latest"):
        assert app.send("POST", "/api/chat", json={**CHAT, "model": name,
                                                   "stream": False}).json()["model"] == name
    assert error_of(app.send("POST", "/api/chat", json={**CHAT, "model": f"{ALIAS}:7b"}),
                    404) == f"model '{ALIAS}:7b' not found"
    assert resolve_name("smol:latest", ["smol"]) == "smol"
    with pytest.raises(ModelNotFoundError):
        resolve_name("smol:v2", ["smol"])


def test_keep_alive_and_budget_parsing() -> None:
    assert keep_alive(None) is None and keep_alive(0) == 0 and keep_alive(2.5) == 2.5
    assert keep_alive("5m") == 300 and keep_alive("90s") == 90 and keep_alive(-1) == -1
    assert keep_alive("-5m") == -1
    for bad in ("soon", True, "5d", [1]):
        with pytest.raises(InvalidOptionError):
            keep_alive(bad)
    assert token_budget(None, 10, 100, 33) == 33 and token_budget(5, 10, 100, 33) == 5
    assert token_budget(-1, 10, 100, 33) == 90 == token_budget(-2, 10, 100, 33)


def test_load_only_requests(app: FakeApp) -> None:
    load = app.send("POST", "/api/chat", json={"model": ALIAS, "messages": []}).json()
    assert load["done"] and load["done_reason"] == "load"
    unload = app.send("POST", "/api/generate", json={"model": ALIAS, "keep_alive": 0}).json()
    assert unload["done_reason"] == "unload" and unload["response"] == ""


def test_model_endpoints_and_refusals(app: FakeApp) -> None:
    [model] = app.send("GET", "/api/tags").json()["models"]
    assert model["name"] == ALIAS and model["details"]["format"] == "gguf"
    assert app.send("GET", "/api/ps").json()["models"][0]["context_length"] > 0
    assert app.send("GET", "/api/version").json()["version"]
    shown = app.send("POST", "/api/show", json={"model": ALIAS}).json()
    assert shown["capabilities"][0] == "completion" and "template" in shown
    assert error_of(app.send("POST", "/api/show", json={"model": "x"}), 404)
    assert app.send("POST", "/api/pull", json={"model": ALIAS}).text == '{"status":"success"}\n'
    for method, path in (("POST", "/api/pull"), ("POST", "/api/push"), ("POST", "/api/create"),
                         ("POST", "/api/copy"), ("DELETE", "/api/delete")):
        assert "not supported" in error_of(app.send(method, path, json={"model": "x"}), 400)


def hermes_output() -> ChatOutput:
    """The chat layer's parser of Hermes calls to ``get_weather``."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    params = source_templates(HERMES_TOOLS_TEMPLATE).apply({
        "messages": [{"role": "user", "content": "hi"}], "tools": [tool]})
    return ChatOutput(params, reasoning_format="auto", tools=True)


def test_tool_calls_come_back_as_objects(app: FakeApp) -> None:
    served = ServedModel(app.server, name=ALIAS)
    plan = OllamaPlan(served=served, kind="chat", model=ALIAS, token_ids=[1],
                      intent=app.server.resolve(),
                      parser=lambda: hermes_output())
    stream = OllamaStream(plan)
    text = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    chunks = [c for piece in (text[:9], text[9:40], text[40:])
              for c in stream.on_event(TokenEvent(request_id=1, token_id=0, text=piece))]
    chunks += stream.on_event(DoneEvent(request_id=1, finish_reason="eog",  # type: ignore[arg-type]
                                        completion_tokens=3, prompt_tokens=1,
                                        timings=RequestTimings()))
    whole = collect(chunks)
    assert whole["message"]["content"] == "Sure."
    [call] = whole["message"]["tool_calls"]
    assert call["function"] == {"index": 0, "name": "get_weather", "arguments": {"city": "Oslo"}}
    assert whole["done"] and whole["done_reason"] == "stop"


def test_a_wrong_key_is_a_401_in_ollamas_shape() -> None:
    with FakeApp(app_options={"api_key": "sekret"}) as keyed:
        assert error_of(keyed.send("POST", "/api/chat", json=CHAT), 401)
        assert error_of(keyed.send("GET", "/api/tags"), 401)
        ok = keyed.send("GET", "/api/tags", headers={"authorization": "Bearer sekret"})
        assert ok.status_code == 200


def _live_module() -> ModuleType:
    path = Path(__file__).parents[1] / "http" / "live.py"
    spec = importlib.util.spec_from_file_location("ollama_fake_live", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_client_hanging_up_mid_stream_cancels_the_request() -> None:
    server = fake_server(n_ctx=1024, n_parallel=1, sleep_s=0.02)
    body = {**CHAT, "options": {"num_predict": 500}}
    with _live_module().LiveApp(create_app(server, alias=ALIAS, own_server=True)) as live:
        server.wait_ready(10)
        with httpx.Client(base_url=live.url, timeout=30) as http, \
                http.stream("POST", "/api/chat", json=body) as answer:
            lines = answer.iter_lines()
            assert json.loads(next(lines))["done"] is False
        deadline = time.monotonic() + 5  # far sooner than 500 tokens at 20 ms each
        while (stats := server.stats())["slots_active"] or not stats["num_cancelled"]:
            assert time.monotonic() < deadline, stats
            time.sleep(0.02)


def test_keep_alive_goes_to_the_model_manager(tmp_path: Path) -> None:
    path = tmp_path / "one.gguf"
    path.write_bytes(b"GGUF")
    manager = ModelManager([ModelSpec(name="one", path=str(path))],
                           server_factory=lambda spec: fake_server(spec.path, n_ctx=512))
    from starlette.testclient import TestClient

    with TestClient(create_app(manager, own_server=True), base_url="http://localhost") as http:
        body = {"model": "one:latest", "prompt": "hi", "stream": False,
                "options": {"num_predict": 2}, "keep_alive": "10m"}
        assert http.post("/api/generate", json=body).status_code == 200
        assert manager.status_of("one").keep_alive == 600
        [running] = http.get("/api/ps").json()["models"]
        assert running["name"] == "one" and running["expires_at"] != "9999-12-31T23:59:59Z"
        unload = http.post("/api/generate", json={"model": "one", "keep_alive": 0}).json()
        assert unload["done_reason"] == "unload"
        deadline = time.monotonic() + 5
        while manager.status_of("one").state.value != "unloaded":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert http.get("/api/ps").json() == {"models": []}
        missing = http.post("/api/chat", json={**CHAT, "model": "two"})
        assert missing.status_code == 404 and set(missing.json()) == {"error"}


THINKING_TEMPLATE = (  # (it shows past reasoning: the chat layer reads the format from that)
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and "
    "m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}")


def test_think_reaches_the_template_and_reasoning_comes_back_as_thinking(app: FakeApp) -> None:
    served = ServedModel(app.server, name=ALIAS, chat_template=THINKING_TEMPLATE)
    body = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]}
    plans = {think: prepare_chat_request(served, {**body, "think": think})
             for think in (True, False, "low")}
    assert plans[True].token_ids == plans["low"].token_ids != plans[False].token_ids
    stream = OllamaStream(plans[True])
    chunks = [c for piece in ("<think>hm", "m</think>", "Hello")
              for c in stream.on_event(TokenEvent(request_id=1, token_id=0, text=piece))]
    chunks += stream.on_event(DoneEvent(request_id=1, finish_reason="eog",  # type: ignore[arg-type]
                                        completion_tokens=3, prompt_tokens=1,
                                        timings=RequestTimings()))
    message = collect(chunks)["message"]
    assert message["thinking"] == "hmm" and message["content"] == "Hello"


def test_history_tool_calls_and_results_become_openai_messages() -> None:
    messages = [Message(role="user", content="Weather?"),
                Message.model_validate({"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "a", "arguments": {"x": 1}}},
                    {"function": {"name": "b", "arguments": {}}}]}),
                Message(role="tool", tool_name="b", content="B"),
                Message(role="tool", content="A")]
    out = chat_messages(messages)
    calls = out[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ['{"x": 1}', "{}"]
    assert out[2] == {"role": "tool", "content": "B", "tool_call_id": calls[1]["id"], "name": "b"}
    assert out[3]["tool_call_id"] == calls[0]["id"]


def test_a_prompt_past_the_context_is_refused_before_any_line(app: FakeApp) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "word " * 3000}]}
    answer = app.send("POST", "/api/chat", json=body)
    assert "context" in error_of(answer, 400).lower()
    app.check_idle()


def test_logprobs_one_per_generated_token(app: FakeApp) -> None:
    body = {**CHAT, "logprobs": True, "top_logprobs": 2}
    text = app.send("POST", "/api/chat", json=body).text
    lines = [json.loads(line) for line in text.splitlines()]
    streamed = [entry for line in lines for entry in line.get("logprobs", [])]
    whole = app.send("POST", "/api/chat", json={**body, "stream": False}).json()
    assert len(streamed) == len(whole["logprobs"]) == whole["eval_count"] == 4
    assert all(len(entry["top_logprobs"]) == 2 and entry["logprob"] <= 0
               for entry in whole["logprobs"])
    assert "logprobs" not in app.send("POST", "/api/chat", json={**CHAT, "stream": False}).json()


def test_nulls_and_empty_values_mean_not_set(app: FakeApp) -> None:
    nulls = {"format": "", "options": {}, "keep_alive": None, "think": None, "stream": False}
    chat = {**CHAT, **nulls, "tools": [],
            "messages": [{"role": "user", "content": None, "images": None}]}
    assert app.send("POST", "/api/chat", json=chat).status_code == 200
    generate = {"model": ALIAS, "prompt": "hi", "suffix": None, "template": None,
                "system": None, "context": None, "images": [], **nulls}
    assert app.send("POST", "/api/generate", json=generate).status_code == 200
    load = app.send("POST", "/api/chat", json={"model": ALIAS, "messages": None}).json()
    assert load["done_reason"] == "load"
