"""Anthropic ``cache_control`` and Responses' ``prompt_cache_retention`` over HTTP on the fake
backend: breakpoints pin their prefixes (the usage says what was written and what was read),
pins outlive other traffic's eviction pressure, bad controls are 400s in the API's shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fake_http import ALIAS, FakeApp, fake_app

SYSTEM = "You are a careful assistant. " * 8  # about 250 fake tokens
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture()
def app() -> Iterator[FakeApp]:
    """One slot and a RAM cache of about five prompts: other traffic evicts."""
    with fake_app(options={"prompt_cache_ram_mb": 0.1, "n_parallel": 1}) as served:
        yield served


def message(app: FakeApp, body: dict[str, Any]) -> dict[str, Any]:
    response = app.send("POST", "/v1/messages", json={"model": ALIAS, "max_tokens": 4, **body})
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def pinned_system(user: str, **control: Any) -> dict[str, Any]:
    return {"system": [{"type": "text", "text": SYSTEM,
                        "cache_control": {**EPHEMERAL, **control}}],
            "messages": [{"role": "user", "content": user}]}


def other_traffic(app: FakeApp, n: int = 8) -> None:
    for i in range(n):
        message(app, {"messages": [{"role": "user", "content": f"other {i} " * 30}]})


def total(usage: dict[str, Any]) -> int:
    return (usage["input_tokens"] + usage["cache_creation_input_tokens"]
            + usage["cache_read_input_tokens"])


def test_a_system_breakpoint_is_written_once_then_read_after_other_traffic(app: FakeApp):
    first = message(app, pinned_system("hello there"))
    assert first["cache_read_input_tokens"] == 0
    pinned = first["cache_creation_input_tokens"]
    assert 200 < pinned < total(first)
    other_traffic(app)
    assert app.server.stats()["ram_cache_evictions"] > 0
    again = message(app, pinned_system("a different question", ttl="1h"))
    assert (again["cache_read_input_tokens"], again["cache_creation_input_tokens"]) == (pinned, 0)
    assert app.server.stats()["ram_cache_pinned_bytes"] > 0
    app.check_idle()


def test_without_breakpoints_nothing_is_written(app: FakeApp):
    usage = message(app, {"system": SYSTEM, "messages": [{"role": "user", "content": "hi"}]})
    assert usage["cache_creation_input_tokens"] == 0
    assert app.server.stats()["ram_cache_pinned_bytes"] == 0


def test_streamed_usage_reports_the_written_tokens(app: FakeApp):
    body = {"model": ALIAS, "max_tokens": 4, "stream": True, **pinned_system("hello")}
    response = app.send("POST", "/v1/messages", json=body)
    assert response.status_code == 200
    deltas = [line for line in response.text.splitlines() if '"message_delta"' in line]
    assert '"cache_creation_input_tokens":' in deltas[-1].replace(" ", "")
    assert '"cache_creation_input_tokens":0' not in deltas[-1].replace(" ", "")


def test_the_top_level_control_pins_the_whole_prompt(app: FakeApp):
    body = {"messages": [{"role": "user", "content": "a whole prompt to keep " * 4}],
            "cache_control": EPHEMERAL}
    first = message(app, body)
    assert first["cache_creation_input_tokens"] == total(first)
    other_traffic(app)
    again = message(app, body)
    assert again["cache_read_input_tokens"] == total(again) - 1  # all but the last token
    assert again["cache_creation_input_tokens"] == 0


def test_a_breakpoint_in_a_message_pins_up_to_its_block(app: FakeApp):
    history = [{"role": "user", "content": [
        {"type": "text", "text": "first part " * 10, "cache_control": EPHEMERAL},
        {"type": "text", "text": "second part " * 10}]}]
    first = message(app, {"system": SYSTEM, "messages": history})
    written = first["cache_creation_input_tokens"]
    assert 0 < written < total(first)
    history[0]["content"][1]["text"] = "changed " * 10
    again = message(app, {"system": SYSTEM, "messages": history})
    assert again["cache_read_input_tokens"] >= written


BAD_CONTROLS = [
    {"system": [{"type": "text", "text": "s", "cache_control": {**EPHEMERAL, "ttl": "2h"}}]},
    {"system": [{"type": "text", "text": "s", "cache_control": {"type": "bogus"}}]},
    {"cache_control": {"type": "ephemeral", "ttl": 300}},
    {"cache_control": {"type": "ephemeral", "extra": 1}},
    {"tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": "yes"}]},
    {"system": [{"type": "text", "text": "s", "cache_control": {**EPHEMERAL, "ttl": "5m"}}],
     "cache_control": {**EPHEMERAL, "ttl": "1h"}},  # a 1h after a 5m
    {"system": [{"type": "text", "text": str(i), "cache_control": EPHEMERAL}
                for i in range(5)]},
]


@pytest.mark.parametrize("extra", BAD_CONTROLS)
def test_bad_cache_controls_are_400s_in_anthropics_shape(app: FakeApp, extra: dict[str, Any]):
    body = {"model": ALIAS, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}], **extra}
    response = app.send("POST", "/v1/messages", json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert "cache_control" in error["error"]["message"]


def test_cache_pins_is_not_an_anthropic_body_field(app: FakeApp):
    body = {"model": ALIAS, "max_tokens": 4, "cache_pins": [[4, 300]],
            "messages": [{"role": "user", "content": "hi"}]}
    assert app.send("POST", "/v1/messages", json=body).status_code == 400


# --- Responses' prompt_cache_retention -----------------------------------------------------------


def response_usage(app: FakeApp, text: str, **fields: Any) -> dict[str, Any]:
    body = {"model": ALIAS, "max_output_tokens": 4, "input": text, **fields}
    response = app.send("POST", "/v1/responses", json=body)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


@pytest.mark.parametrize(("retention", "kept"), [("24h", True), ("in_memory", True),
                                                 (None, False)])
def test_prompt_cache_retention_keeps_the_whole_prompt_through_other_traffic(
        app: FakeApp, retention: str | None, kept: bool):
    text = "a long stable instruction to keep around " * 5
    fields = {} if retention is None else {"prompt_cache_retention": retention}
    first = response_usage(app, text, **fields)
    other_traffic(app)
    again = response_usage(app, text, **fields)
    cached = again["input_tokens_details"]["cached_tokens"]
    assert (cached == first["input_tokens"] - 1) is kept  # all but the last token
    app.check_idle()


@pytest.mark.parametrize("retention", ["1h", "", 24, "IN_MEMORY"])
def test_a_bad_prompt_cache_retention_is_a_400_in_openais_shape(app: FakeApp, retention: Any):
    body = {"model": ALIAS, "max_output_tokens": 4, "input": "hi",
            "prompt_cache_retention": retention}
    response = app.send("POST", "/v1/responses", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "prompt_cache_retention" in error["message"]


def test_chat_completions_take_prompt_cache_retention_and_key(app: FakeApp):
    body = {"model": ALIAS, "max_tokens": 4, "prompt_cache_retention": "24h",
            "prompt_cache_key": "agent-1",
            "messages": [{"role": "user", "content": "keep this prompt around " * 6}]}
    first = app.send("POST", "/v1/chat/completions", json=body).json()["usage"]
    other_traffic(app)
    again = app.send("POST", "/v1/chat/completions", json=body).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] == first["prompt_tokens"] - 1
    bad = app.send("POST", "/v1/chat/completions",
                   json={**body, "prompt_cache_retention": "forever"})
    assert bad.status_code == 400 and "prompt_cache_retention" in bad.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/completion"])
def test_cache_pins_is_a_request_option_on_other_routes(app: FakeApp, path: str):
    prompt = "pin the first part of this prompt " * 4
    body: dict[str, Any] = ({"messages": [{"role": "user", "content": prompt}]}
                            if path.startswith("/v1") else {"prompt": prompt})
    ok = app.send("POST", path, json={**body, "max_tokens": 2, "cache_pins": [[40, 300]]})
    assert ok.status_code == 200, ok.text
    assert app.server.stats()["ram_cache_pinned_bytes"] > 0
    bad = app.send("POST", path, json={**body, "max_tokens": 2, "cache_pins": [[40, 7200, 1]]})
    assert bad.status_code == 400 and "cache_pins" in bad.text
