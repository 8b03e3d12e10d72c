"""llama-server's wire details that its own test suite checks, on the fake backend."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_http import ALIAS, FakeApp, sse_events

from llamapy.serve.cli import build_parser
from llamapy.server import GenerationIntent

MESSAGES = [{"role": "user", "content": "Say something."}]


def stream_chunks(app: FakeApp, body: dict[str, object]) -> list[dict[str, object]]:
    r = app.send("POST", "/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    return [json.loads(d) for _, d in sse_events(r.text) if d != "[DONE]"]


def test_the_first_streamed_chunk_is_the_role_with_null_content(app: FakeApp):
    chunks = stream_chunks(app, {"messages": MESSAGES, "max_tokens": 6, "temperature": 0,
                                 "logprobs": True, "top_logprobs": 2})
    first = chunks[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": None}
    for chunk in chunks[1:]:
        assert "role" not in chunk["choices"][0]["delta"]
    app.check_idle()


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}


def engine_options(app: FakeApp, monkeypatch: pytest.MonkeyPatch, path: str,
                   body: dict[str, object]) -> dict[str, object]:
    """The options the route passed to the server for ``body`` (streamed: every API's
    streaming path opens a stream with a ``GenerationIntent``), as a flat mapping."""
    seen: dict[str, object] = {}
    server = app.server
    for name in ("open_stream", "open_astream"):
        original = getattr(server, name)

        def spy(token_ids: object, intent: GenerationIntent, *, _original: Any = original,
                **options: object) -> Any:
            assert not options  # the API layers hand the server typed options only
            seen.update(intent.settings())
            return _original(token_ids, intent, **options)

        monkeypatch.setattr(server, name, spy)
    r = app.send("POST", path, json={**body, "stream": True})
    assert r.status_code == 200, r.text
    return seen


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "tools": [WEATHER]}),
    ("/v1/messages", {"messages": MESSAGES, "max_tokens": 4, "tools": [
        {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]}),
    ("/v1/responses", {"input": "Say something.", "max_output_tokens": 16, "tools": [
        {"type": "function", "name": "get_weather",
         "parameters": WEATHER["function"]["parameters"]}]}),
    ("/api/chat", {"messages": MESSAGES, "options": {"num_predict": 4},
                   "tools": [WEATHER]}),
])
def test_offered_tools_get_a_lazy_grammar_of_the_declared_names(
        app: FakeApp, monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]) -> None:
    options = engine_options(app, monkeypatch, path, {"model": ALIAS, **body})
    # the fake's template knows no tools: Hermes' format stands in, opened by "<tool_call>\n"
    assert options["grammar_triggers"] == ("<tool_call>\\x0a",)
    grammar = str(options["grammar"])
    assert "get_weather" in grammar and "location" in grammar
    app.check_idle()


def test_no_lazy_grammar_without_tools_or_with_tool_choice_none(
        app: FakeApp, monkeypatch: pytest.MonkeyPatch) -> None:
    for extra in ({}, {"tools": [WEATHER], "tool_choice": "none"}):
        options = engine_options(app, monkeypatch, "/v1/chat/completions",
                                 {"messages": MESSAGES, "max_tokens": 4, **extra})
        assert not options["grammar_triggers"] and not options["grammar"]
    app.check_idle()


def test_a_forced_call_is_one_call_unless_parallel_tool_calls(
        app: FakeApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """tool_choice required on a template without tools: the calls at once, in the Hermes
    stand-in's framing (no text first, no generation prompt to read); with
    parallel_tool_calls more calls may follow, each framed alike (the grammar's shapes are
    matched in tests/grammar)."""
    between = '"\\n</tool_call>\\n<tool_call>\\n"'
    for parallel in (False, True):
        options = engine_options(app, monkeypatch, "/v1/chat/completions", {
            "model": ALIAS, "messages": MESSAGES, "max_tokens": 4, "tools": [WEATHER],
            "tool_choice": "required", "parallel_tool_calls": parallel})
        root = next(line for line in str(options["grammar"]).splitlines()
                    if line.startswith("root ::="))
        assert not options["grammar_triggers"] and not options["grammar_prefill"]
        assert root.startswith('root ::= "<tool_call>\\n" call'), root
        assert (between in root) is parallel, root
    app.check_idle()


def test_a_schema_keyword_the_converter_does_not_know_leaves_that_value_free(
        app: FakeApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """As llama.cpp's converter (which llama-server uses) reads it: an unknown string
    ``format`` is any string; offered and forced calls both keep their grammar."""
    fetch = {"type": "function", "function": {"name": "fetch", "parameters": {
        "type": "object", "properties": {"url": {"type": "string", "format": "no-such-format"},
                                         "timeout": {"type": "number", "maximum": 600}}}}}
    options = engine_options(app, monkeypatch, "/v1/chat/completions",
                             {"model": ALIAS, "messages": MESSAGES, "max_tokens": 4,
                              "tools": [fetch]})
    assert options["grammar_triggers"] and "fetch" in str(options["grammar"])
    forced = app.send("POST", "/v1/chat/completions", json={
        "model": ALIAS, "messages": MESSAGES, "max_tokens": 4, "tools": [fetch],
        "tool_choice": "required"})
    assert forced.status_code == 200, forced.text
    app.check_idle()


def test_a_tool_schema_too_deep_for_the_converter_is_a_400(app: FakeApp) -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"a": deep}}
    tool = {"type": "function", "function": {"name": "deep", "parameters": deep}}
    r = app.send("POST", "/v1/chat/completions", json={
        "model": ALIAS, "messages": MESSAGES, "max_tokens": 4, "tools": [tool]})
    assert r.status_code == 400 and "deeper" in r.text
    app.check_idle()


def test_backend_sampling_is_accepted_and_changes_nothing(app: FakeApp) -> None:
    body = {"prompt": "The countries of Europe are:", "n_predict": 6, "n_probs": 3,
            "seed": 4242, "temperature": 0.8}
    answers = [app.send("POST", "/completion", json={**body, "backend_sampling": flag})
               for flag in (True, False)]
    assert [r.status_code for r in answers] == [200, 200]
    on, off = (r.json() for r in answers)
    assert on["content"] == off["content"]
    assert on["completion_probabilities"] == off["completion_probabilities"]
    bad = app.send("POST", "/completion", json={**body, "backend_sampling": "yes"})
    assert bad.status_code == 400 and "backend_sampling" in bad.text
    for flag in ("-bs", "--backend-sampling", "--backend_sampling"):
        assert build_parser().parse_args([flag]).backend_sampling is True
    app.check_idle()


def test_response_fields_pick_paths_of_the_completion_response(app: FakeApp) -> None:
    body = {"prompt": "I believe the meaning of life is", "n_predict": 5, "temperature": 0}
    whole = app.send("POST", "/completion", json=body).json()
    fields = ["content", "generation_settings/n_predict", "prompt", "timings/nothing"]
    picked = app.send("POST", "/completion", json={**body, "response_fields": fields}).json()
    assert picked == {"content": whole["content"], "prompt": whole["prompt"],
                      "generation_settings/n_predict": 5}
    assert app.send("POST", "/completion", json={**body, "response_fields": []}).json().keys() \
        == whole.keys()
    for bad in ("content", [1], [""], ["x" * 257], ["a"] * 65):
        r = app.send("POST", "/completion", json={**body, "response_fields": bad})
        assert r.status_code == 400 and "response_fields" in r.text
    app.check_idle()


def test_every_openai_response_names_the_serving_build_in_system_fingerprint(app: FakeApp):
    """As llama-server names its build there; the official client reads it as a string."""
    from llamapy.openai_api.report import SYSTEM_FINGERPRINT

    assert SYSTEM_FINGERPRINT.startswith("llamapy-") and "llama.cpp-" in SYSTEM_FINGERPRINT
    chat = {"model": ALIAS, "messages": MESSAGES, "max_tokens": 3}
    assert app.send("POST", "/v1/chat/completions", json=chat).json()[
        "system_fingerprint"] == SYSTEM_FINGERPRINT
    assert {c["system_fingerprint"] for c in stream_chunks(app, chat)} == {SYSTEM_FINGERPRINT}
    completion = {"model": ALIAS, "prompt": "Say", "max_tokens": 3}
    assert app.send("POST", "/v1/completions", json=completion).json()[
        "system_fingerprint"] == SYSTEM_FINGERPRINT
    app.check_idle()
