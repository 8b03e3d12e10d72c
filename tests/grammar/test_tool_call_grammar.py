"""tool_call_grammar: forced calls in each protocol, and a round trip through the output parser."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from gbnf_match import Grammar
from schema_strategies import validator

from llamapy.chat import OutputParser
from llamapy.chat.parsers import TOOL_CALL_PROTOCOLS
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


def grammar(style: str, choice: Any = "required", parallel: bool = False) -> Grammar:
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


def test_llama3_and_mistral_shapes() -> None:
    assert grammar("llama3_json").matches('{"name": "now", "parameters": {}}')
    assert not grammar("llama3_json").matches('{"name": "now", "arguments": {}}')
    mistral = grammar("mistral", parallel=True)
    two = '[TOOL_CALLS] [{"name": "now", "arguments": {}}, {"name": "now", "arguments": {}}]'
    assert mistral.matches(two)
    assert not grammar("mistral").matches(two)


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


@pytest.mark.parametrize("style", sorted(TOOL_CALL_PROTOCOLS))
def test_generated_calls_parse_back_into_valid_tool_calls(style: str) -> None:
    """What the grammar lets a model write, the matching parser turns into valid calls."""
    g = grammar(style, parallel=True)
    rng = random.Random(1234)
    for _ in range(40):
        text = g.sample(rng)
        parser = OutputParser.from_protocols([style])
        for start in range(0, len(text), 5):
            parser.feed(text[start : start + 5])
        message = parser.finish()
        assert message.content is None, text
        assert message.tool_calls, text
        for call in message.tool_calls:
            arguments = json.loads(call.arguments)
            assert validator(PARAMETERS[call.name]).is_valid(arguments), call
