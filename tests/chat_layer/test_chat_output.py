"""ChatOutput: the chat layer's parses as the deltas every API streams (no model needed)."""

from __future__ import annotations

import itertools

import pytest

from llamapy.chat.layer import HERMES_TOOLS_TEMPLATE, ChatOutput, source_templates
from llamapy.errors import ChatParseError

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALLS = ('Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
         '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
         '</tool_call>')


def output(tools: bool = True) -> ChatOutput:
    params = source_templates(HERMES_TOOLS_TEMPLATE).apply({
        "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER] if tools else [],
        "parallel_tool_calls": True})
    ids = (f"call_{i}" for i in itertools.count())
    return ChatOutput(params, reasoning_format="auto", tools=tools, id_factory=lambda: next(ids))


@pytest.mark.parametrize("size", [1, 2, 5, 11, len(CALLS)])
def test_streamed_deltas_add_up_to_the_message_and_name_each_call_once(size: int) -> None:
    out = output()
    deltas = [out.feed(CALLS[i:i + size]) for i in range(0, len(CALLS), size)]
    deltas.append(out.flush())
    message = out.finish()
    assert message.content == "Checking."
    assert [(c.id, c.name) for c in message.tool_calls] == [("call_0", "get_weather"),
                                                            ("call_1", "get_weather")]
    assert [c.arguments.replace(" ", "") for c in message.tool_calls] == [
        '{"city":"Paris"}', '{"city":"Oslo"}']
    headers = [p for d in deltas for p in d.tool_call_deltas if p.name is not None]
    assert [(p.index, p.id, p.name) for p in headers] == [(0, "call_0", "get_weather"),
                                                          (1, "call_1", "get_weather")]
    assert "".join(d.content for d in deltas) == "Checking."


def test_a_call_cut_off_is_an_error_not_content() -> None:
    out = output()
    out.feed('<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    with pytest.raises(ChatParseError):
        out.flush()


def test_without_tools_the_call_syntax_is_content() -> None:
    out = output(tools=False)
    out.feed(CALLS)
    message = out.finish()
    assert not message.tool_calls and message.content == CALLS


def test_an_opening_that_never_became_a_call_is_an_error_not_lost() -> None:
    out = output()
    out.feed('Hello <tool_call>\n{"na')
    with pytest.raises(ChatParseError):
        out.flush()


def test_a_call_cut_off_by_the_token_budget_is_kept_as_far_as_it_got() -> None:
    """The budget ran out (the client sees that finish reason): no error, the partial call."""
    out = output()
    out.feed('<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    message = out.finish(truncated=True)
    assert [c.name for c in message.tool_calls] == ["get_weather"]


def test_text_the_format_cannot_read_is_never_dropped_when_cut_off() -> None:
    """A truncated output the final parse refuses and that began no call: the text the
    partial parse held back comes out as content."""
    out = output()
    out.feed("Hello <tool_")
    message = out.finish(truncated=True)
    assert not message.tool_calls and message.content == "Hello <tool_"
