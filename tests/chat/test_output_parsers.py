"""Streaming output parsers: reasoning split, tool-call formats, registry, chunking invariance."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.chat import (
    Delta,
    OutputParser,
    ParsedMessage,
    ReasoningParser,
    ToolCall,
    new_tool_call_id,
    prompt_opens_reasoning,
    protocol_kind,
    reasoning_parser,
    tool_call_parser,
)
from llamapy.errors import InvalidOptionError, UnsupportedFeatureError


def counter_ids() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"call_{next(numbers)}"


def parse(
    protocols: Sequence[str], text: str, *, chunk: int = 1, started: bool = False
) -> tuple[ParsedMessage, list[Delta]]:
    """Feed ``text`` in ``chunk``-sized pieces; return the message and the non-empty deltas."""
    parser = OutputParser.from_protocols(
        protocols, reasoning_started=started, id_factory=counter_ids()
    )
    deltas = [parser.feed(text[i : i + chunk]) for i in range(0, len(text), chunk)]
    deltas.append(parser.flush())
    return parser.finish(), [d for d in deltas if not d.empty]


def call(index: int, name: str, arguments: str) -> ToolCall:
    return ToolCall(id=f"call_{index}", name=name, arguments=arguments)


# --- reasoning ------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 2, 5, 1000])
def test_reasoning_then_answer(chunk: int) -> None:
    message, _ = parse(["think"], "<think>\nLet me see.\n</think>\n\nThe answer.", chunk=chunk)
    assert message == ParsedMessage(content="The answer.", reasoning_content="Let me see.")


def test_reasoning_opened_by_the_template() -> None:
    message, _ = parse(["think"], "Hmm.</think>Yes.", started=True)
    assert message == ParsedMessage(content="Yes.", reasoning_content="Hmm.")
    message, _ = parse(["think"], "<think>Hmm.</think>Yes.", started=True)
    assert message == ParsedMessage(content="Yes.", reasoning_content="Hmm.")


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    with pytest.raises(InvalidOptionError):
        prompt_opens_reasoning("x", "hermes")


def test_no_reasoning_and_late_markers_are_content() -> None:
    message, _ = parse(["think"], "Plain <think>not reasoning</think>")
    assert message == ParsedMessage(content="Plain <think>not reasoning</think>")


def test_unclosed_reasoning_stays_reasoning() -> None:
    message, _ = parse(["think"], "<think>still thinking </thi")
    assert message == ParsedMessage(content="", reasoning_content="still thinking </thi")


def test_partial_start_marker_that_never_completes_is_content() -> None:
    message, _ = parse(["think"], "<thin")
    assert message.content == "<thin"
    message, _ = parse(["think"], "<thinking about it")
    assert message.content == "<thinking about it"


def test_custom_markers_and_no_partial_marker_ever_streams() -> None:
    parser = ReasoningParser("[R]", "[/R]")
    pieces = [parser.feed(ch) for ch in "[R]abc[/R]def"] + [parser.flush()]
    assert [p.reasoning for p in pieces if p.reasoning] == ["a", "b", "c"]
    assert "".join(p.content for p in pieces) == "def"


def test_reasoning_parser_is_streaming() -> None:
    parser = reasoning_parser("think")
    assert parser.feed("<think>abc").reasoning == "abc"
    assert parser.in_reasoning
    assert parser.feed("de </").reasoning == "de"
    assert parser.feed("think> Hi").content == "Hi"
    assert not parser.in_reasoning


# --- tool calls ------------------------------------------------------------------------------

HERMES_TWO_CALLS = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name": "get_time", "arguments": {}}\n</tool_call>'
)


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_hermes_calls(chunk: int) -> None:
    message, _ = parse(["hermes"], HERMES_TWO_CALLS, chunk=chunk)
    assert message == ParsedMessage(
        content="Let me check.",
        tool_calls=(
            call(0, "get_weather", '{"city": "Paris", "days": [1, 2]}'),
            call(1, "get_time", "{}"),
        ),
    )


def test_streamed_tool_call_deltas() -> None:
    _, deltas = parse(["hermes"], HERMES_TWO_CALLS, chunk=4)
    pieces = [piece for delta in deltas for piece in delta.tool_call_deltas]
    heads = [p for p in pieces if p.id is not None]
    assert [(p.index, p.id, p.name, p.arguments) for p in heads] == [
        (0, "call_0", "get_weather", ""),
        (1, "call_1", "get_time", ""),
    ]
    first_args = "".join(p.arguments for p in pieces if p.index == 0)
    assert json.loads(first_args) == {"city": "Paris", "days": [1, 2]}
    assert len([p for p in pieces if p.index == 0]) > 3  # arguments stream in fragments
    assert pieces[0].to_openai() == {
        "index": 0,
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert pieces[1].to_openai() == {"index": 0, "function": {"arguments": pieces[1].arguments}}


def test_llama3_json_calls() -> None:
    bare = '{"name": "search", "parameters": {"q": "llama"}}'
    message, _ = parse(["llama3_json"], bare)
    assert message.tool_calls == (call(0, "search", '{"q": "llama"}'),)
    assert message.content is None
    tagged = '<|python_tag|>{"name": "a", "arguments": {}}; {"name": "b", "parameters": {"x": 1}}'
    message, _ = parse(["llama3_json"], tagged, chunk=2)
    assert message.tool_calls == (call(0, "a", "{}"), call(1, "b", '{"x": 1}'))


def test_llama3_plain_json_answers_stay_content() -> None:
    for text in ['{"answer": 42}', '{"name": "Bob", "age": 3}', "{}", "  {not json"]:
        message, _ = parse(["llama3_json"], text)
        assert message == ParsedMessage(content=text), text


def test_mistral_calls() -> None:
    text = (
        'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}, "id": "abcdefghi"}, '
        '{"name": "g", "arguments": "{\\"y\\": 2}"}]'
    )
    message, _ = parse(["mistral"], text, chunk=3)
    assert message == ParsedMessage(
        content="Sure.", tool_calls=(call(0, "f", '{"x": 1}'), call(1, "g", '{"y": 2}'))
    )


def test_text_that_is_not_a_call_is_content() -> None:
    text = "Use <tool_call> like this: <tool_call>{not json}</tool_call> ok"
    message, _ = parse(["hermes"], text)
    assert message == ParsedMessage(content=text)
    message, _ = parse(["hermes"], '<tool_call>{"arguments": {}}</tool_call>')
    assert message == ParsedMessage(content='<tool_call>{"arguments": {}}</tool_call>')


def test_truncated_call_keeps_what_streamed() -> None:
    message, _ = parse(["hermes"], '<tool_call>\n{"name": "f", "arguments": {"a": [1,')
    assert message.tool_calls == (call(0, "f", '{"a": [1,'),)


def test_think_and_tools_compose() -> None:
    text = '<think>need weather</think>\n<tool_call>{"name": "w", "arguments": {}}</tool_call>'
    message, _ = parse(["think", "hermes"], text, chunk=2)
    assert message == ParsedMessage(
        content=None, reasoning_content="need weather", tool_calls=(call(0, "w", "{}"),)
    )
    assert message.to_openai() == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "need weather",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "w", "arguments": "{}"}}
        ],
    }


def test_parsed_message_without_protocols_is_plain_text() -> None:
    message, _ = parse([], "<think>x</think> <tool_call>")
    assert message == ParsedMessage(content="<think>x</think> <tool_call>")


# --- registry --------------------------------------------------------------------------------


def test_registry() -> None:
    assert protocol_kind("think") == "reasoning"
    assert protocol_kind("qwen") == protocol_kind("mistral") == "tool_calls"
    with pytest.raises(UnsupportedFeatureError) as info:
        OutputParser.from_protocols(["think", "granite"])
    assert info.value.feature == "granite"
    assert info.value.http_status == 400
    with pytest.raises(InvalidOptionError):
        OutputParser.from_protocols(["hermes", "mistral"])
    with pytest.raises(InvalidOptionError):
        reasoning_parser("hermes")
    with pytest.raises(InvalidOptionError):
        tool_call_parser("think")


def test_feed_after_flush_is_an_error() -> None:
    parser = OutputParser.from_protocols(["think"])
    parser.flush()
    with pytest.raises(RuntimeError):
        parser.feed("x")


def test_new_tool_call_id_shape() -> None:
    ids = {new_tool_call_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(i.startswith("call_") and len(i) == 29 and i[5:].isalnum() for i in ids)


# --- property: chunking never changes the result ------------------------------------------------

FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    '{"name": "f", "arguments": {"a": "}"}}',
    '{"name": "g", "parameters": {}}',
    '[{"name": "m", "arguments": {"k": [1, {"z": null}]}}]',
    '{"x": 1}',
    "{",
    "}",
    '"',
    "<",
    "</",
    " ",
    "\n",
    ";",
    ",",
    "hello",
    "wörld",
]


@st.composite
def outputs_and_cuts(draw: st.DrawFn) -> tuple[str, list[int]]:
    text = "".join(draw(st.lists(st.sampled_from(FRAGMENTS), max_size=12)))
    cuts = sorted(draw(st.sets(st.integers(0, max(len(text), 0)), max_size=10)))
    return text, cuts


@settings(max_examples=5 * settings.default.max_examples, deadline=None)  # cheap: 5x profile
@given(
    case=outputs_and_cuts(),
    protocols=st.sampled_from(
        [["think"], ["hermes"], ["llama3_json"], ["mistral"], ["think", "hermes"]]
    ),
    started=st.booleans(),
)
def test_chunking_never_changes_the_message(
    case: tuple[str, list[int]], protocols: list[str], started: bool
) -> None:
    text, cuts = case
    one_shot, _ = parse(protocols, text, chunk=max(len(text), 1), started=started)
    parser = OutputParser.from_protocols(
        protocols, reasoning_started=started, id_factory=counter_ids()
    )
    bounds = [0, *cuts, len(text)]
    deltas = [parser.feed(text[a:b]) for a, b in itertools.pairwise(bounds)]
    deltas.append(parser.flush())
    assert parser.finish() == one_shot
    streamed = "".join(d.content for d in deltas)
    assert streamed == (one_shot.content or "")
    assert "".join(d.reasoning for d in deltas) == (one_shot.reasoning_content or "")


@pytest.mark.parametrize("chunk", [1, 3, 100])
@pytest.mark.parametrize("bad_key", ['"\n', '"\\x"'])
def test_a_key_that_is_not_json_leaves_the_text_as_content(bad_key: str, chunk: int) -> None:
    # A raw newline or a bad escape in a key: not a tool call, and no exception (found by the
    # chunking property above).
    text = '{' + bad_key + '{"name": "f", "arguments": {"a": "}"}}'
    message, _ = parse(["llama3_json"], text, chunk=chunk)
    assert message.tool_calls == () and message.content == text
