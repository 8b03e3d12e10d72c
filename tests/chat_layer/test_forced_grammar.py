"""A forced call's grammar starts the call at once (llamapy's rewrite of llama.cpp's root),
for every template llama.cpp ships that forces calls: the rewritten grammar parses, reads the
template's generation prompt (as the sampler feeds it first), and leaves no free text before
the call; one call unless ``parallel_tool_calls``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_prompt_parity import TEMPLATES

from llamapy._native.chat_layer import ChatTemplates
from llamapy._native.sampler import SamplerChain
from llamapy.llama_sampler import prefill_tokens
from llamapy.models import default_model_path
from llamapy.openai_api.forced import call_at_once

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": CITY}}
         for n in ("get_weather", "get_time")]


@pytest.fixture(scope="module")
def model() -> Iterator[Any]:
    from llamapy._native.model import Model

    with Model(default_model_path()) as m:
        yield m


def root_of(grammar: str) -> str:
    return next(line for line in grammar.splitlines() if line.startswith("root ::= "))


@pytest.mark.parametrize("name", sorted(p.name for p in TEMPLATES.glob("*.jinja")))
def test_the_call_comes_first_and_the_prefill_fits(model: Any, name: str) -> None:
    try:
        templates = ChatTemplates(model, (TEMPLATES / name).read_text("utf-8"))
        params = templates.apply({
            "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "tool_choice": "required", "enable_thinking": templates.supports_enable_thinking})
    except Exception:  # (templates that refuse this conversation: test_prompt_parity's)
        return
    if not params.grammar:
        return
    grammar = call_at_once(params)
    SamplerChain(model).add_grammar(
        grammar, replay=prefill_tokens(model, params.generation_prompt)).close()
    root = root_of(grammar)
    if root != root_of(params.grammar):  # rewritten: nothing free before the call
        head = root.split("tool-call")[0]
        assert "until-" not in head and "(start any)*" not in head, root


def test_one_call_unless_parallel(model: Any) -> None:
    templates = ChatTemplates(model, (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text())
    params = templates.apply({"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                              "tool_choice": "required"})
    assert root_of(call_at_once(params)).endswith(" tool-call")
    assert root_of(call_at_once(params, parallel=True)).endswith(" tool-calls")
