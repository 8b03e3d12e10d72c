"""tool_call_grammar: forced calls in Hermes' framing, and a round trip through the parsers that
read them (llamapy's Hermes parser, and the chat layer's Hermes stand-in format)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from gbnf_match import Grammar
from schema_strategies import validator

from llamapy.chat import OutputParser, ParsedMessage
from llamapy.chat.layer import HERMES_TOOLS_TEMPLATE, ChatOutput, source_templates
from llamapy.errors import InvalidOptionError, UnsupportedFeatureError
from llamapy.grammar import chosen_function, tool_call_grammar
from llamapy.grammar.tool_calls import select_functions

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now"}}
TOOLS = [WEATHER, CLOCK]
PARAMETERS = {
    "get_weather": WEATHER["function"]["parameters"],
    "now": {"type": "object", "properties": {}, "additionalProperties": False},
}


def grammar(style: str = "hermes", choice: Any = "required", parallel: bool = False
            ) -> Grammar:
    text = tool_call_grammar(TOOLS, choice, style, parallel=parallel)
    assert text is not None
    return Grammar.parse(text)


def test_hermes_call_shape() -> None:
    g = grammar("hermes")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert g.matches(call)
    assert g.matches('<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>')
    assert not g.matches(call.replace("Paris", ""))  # minLength 1
    assert not g.matches(call.replace('"city"', '"town"'))
    assert not g.matches(call.replace("get_weather", "get_wether"))
    assert not g.matches(call + "\n" + call)  # one call unless parallel
    assert grammar("hermes", parallel=True).matches(call + "\n" + call)


def test_named_choice_restricts_to_that_function() -> None:
    g = grammar("hermes", {"type": "function", "function": {"name": "now"}})
    assert g.matches('<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>')
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "X"}}\n</tool_call>'
    assert not g.matches(call)
    assert chosen_function({"type": "function", "name": "now"}) == "now"  # Responses API shape
    assert [f["name"] for f in select_functions(TOOLS, "required")] == ["get_weather", "now"]


def test_choices_without_a_grammar_and_bad_input() -> None:
    assert tool_call_grammar(TOOLS, "auto") is None
    assert tool_call_grammar(TOOLS, "none") is None
    with pytest.raises(InvalidOptionError) as info:
        tool_call_grammar(TOOLS, {"type": "function", "function": {"name": "missing"}})
    assert info.value.option == "tool_choice"
    with pytest.raises(InvalidOptionError):
        tool_call_grammar(TOOLS, "sometimes")
    with pytest.raises(InvalidOptionError):
        select_functions(TOOLS, {"type": "function", "function": {"name": "missing"}})
    with pytest.raises(InvalidOptionError):
        tool_call_grammar([], "required")
    with pytest.raises(InvalidOptionError):
        tool_call_grammar([{"type": "function"}], "required")
    with pytest.raises(UnsupportedFeatureError) as unsupported:
        tool_call_grammar(TOOLS, "required", "granite")
    assert unsupported.value.feature == "granite"
    bad = {"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}
    with pytest.raises(UnsupportedFeatureError) as keyword:
        tool_call_grammar([bad], "required")
    assert keyword.value.feature == "not"


def read_with_output_parser(text: str) -> ParsedMessage:
    parser = OutputParser.from_protocols(["hermes"])
    for start in range(0, len(text), 5):
        parser.feed(text[start : start + 5])
    return parser.finish()


def read_with_the_chat_layer(text: str) -> ParsedMessage:
    """As a request with tools on a template without tools is read (the Hermes stand-in)."""
    params = source_templates(HERMES_TOOLS_TEMPLATE).apply({
        "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
        "tool_choice": "required", "parallel_tool_calls": True})
    output = ChatOutput(params, reasoning_format="none", tools=True)
    for start in range(0, len(text), 5):
        output.feed(text[start : start + 5])
    return output.finish()


@pytest.mark.parametrize("read", [read_with_output_parser, read_with_the_chat_layer])
def test_generated_calls_parse_back_into_valid_tool_calls(
        read: Callable[[str], ParsedMessage]) -> None:
    """What the grammar lets a model write, the Hermes parsers turn into valid calls."""
    g = grammar(parallel=True)
    rng = random.Random(1234)
    for _ in range(40):
        text = g.sample(rng)
        message = read(text)
        assert message.content is None, text
        assert message.tool_calls, text
        for call in message.tool_calls:
            arguments = json.loads(call.arguments)
            assert validator(PARAMETERS[call.name]).is_valid(arguments), call
