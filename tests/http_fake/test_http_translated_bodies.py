"""The Anthropic, Responses and Ollama bodies are translated into a ``ChatRequest`` without
being rebuilt as OpenAI requests, and keep the checks that rebuild gave them (fake backend):
Ollama's tools are function tools, OpenAI's sampling fields carried as extras keep OpenAI's
bounds, an empty conversation is refused, and ``/apply-template`` only renders."""

from __future__ import annotations

from typing import Any

import pytest
from fake_http import ALIAS, FakeApp

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("tools", [
    [{"name": "x"}], [{}], [{"type": "function", "function": {}}],
    [{"type": "function", "function": {"name": 5}}],
    [{"type": "function", "function": {"name": "f", "parameters": "bad"}}],
    [{"type": "function", "function": {"name": "f"}, "junk": 1}],
])
def test_ollama_tools_are_checked_as_function_tools(app: FakeApp, tools: list[Any]) -> None:
    answer = app.send("POST", "/api/chat", json={"model": ALIAS, "messages": USER,
                                                 "tools": tools, "stream": False})
    assert answer.status_code == 400 and answer.json()["error"].startswith("tools[0]: ")
    app.check_idle()


@pytest.mark.parametrize("extra", [{"presence_penalty": 5}, {"frequency_penalty": -9},
                                   {"seed": "abc"}, {"logit_bias": {"1": 500}}])
@pytest.mark.parametrize(("path", "body"), [
    ("/v1/messages", {"messages": USER, "max_tokens": 2}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 16}),
])
def test_openai_sampling_extras_keep_openais_bounds(app: FakeApp, path: str,
                                                    body: dict[str, Any],
                                                    extra: dict[str, Any]) -> None:
    answer = app.send("POST", path, json={"model": ALIAS, **body, **extra})
    assert answer.status_code == 400, answer.text
    assert next(iter(extra)) in answer.text
    app.check_idle()


def test_an_empty_conversation_is_refused(app: FakeApp) -> None:
    for item in ([], [{"type": "reasoning", "summary": []}]):
        answer = app.send("POST", "/v1/responses", json={"model": ALIAS, "input": item,
                                                          "max_output_tokens": 16})
        assert answer.status_code == 400 and "no message" in answer.text
    app.check_idle()


def test_apply_template_only_renders(app: FakeApp) -> None:
    for extra in ({"foo": 1}, {"logit_bias": {"1": 500}}):
        answer = app.send("POST", "/apply-template", json={"messages": USER, **extra})
        assert answer.status_code == 200 and "hi" in answer.json()["prompt"]
