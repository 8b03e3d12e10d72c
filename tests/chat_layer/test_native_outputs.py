"""llamapy reads each model family's native tool calls and reasoning as llama.cpp does.

The cases are llama.cpp's own (the ``peg_test_builder`` cases of its ``tests/test-chat.cpp``, in
``data/native_outputs.json``): a family's template of the pinned source renders a user message
with the case's tools and controls through :class:`ChatTemplates`, and :class:`ChatStream`
parses the model's output with the parser that rendering made, whole and fed in pieces of 1, 3
and 7 characters. The message must be test-chat.cpp's expected one (content and reasoning
compared after stripping, as test-chat.cpp compares them; arguments as JSON; ids exactly), the
streamed differences must add up to that message, and no tool-call syntax may reach the
content.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llamapy._native.chat_layer import ChatDiff, ChatMessage, ChatParams, ChatStream, ChatTemplates
from llamapy._paths import cache_dir
from llamapy._pins import LLAMA_CPP_SOURCE
from llamapy.chat.layer import ChatOutput
from llamapy.errors import ChatParseError

DATA = json.loads((Path(__file__).parent / "data" / "native_outputs.json").read_text("utf-8"))
TOOLS: dict[str, dict[str, Any]] = DATA["tools"]
CASES: list[dict[str, Any]] = DATA["cases"]
TEMPLATES = cache_dir() / "src" / f"llama.cpp-{LLAMA_CPP_SOURCE.sha256[:16]}" / "models" / \
    "templates"
USER = {"role": "user", "content": "Hey there!"}  # test-chat.cpp's message_user
#: the characters C's isspace() strips in llama.cpp's string_strip
SPACE = " \t\n\v\f\r"

BY_ID = {c["id"]: c for c in CASES}


@functools.cache
def templates(name: str, bos: str, eos: str) -> ChatTemplates:
    path = TEMPLATES / name
    assert path.is_file(), f"the pinned llama.cpp source has no {path} (run build_lib.py)"
    return ChatTemplates(None, path.read_text("utf-8"), bos=bos, eos=eos)


@functools.cache
def rendered(case_id: str, bos: str, eos: str) -> ChatParams:
    """The chat layer's rendering of a user message with the case's tools and controls."""
    case = BY_ID[case_id]
    tools = [{"type": "function", "function": {key: TOOLS[name][key] for key in (
        "name", "description", "parameters")}} for name in case["tools"]]
    inputs: dict[str, Any] = {
        "messages": [USER], "tools": tools, "reasoning_format": case["reasoning_format"],
        "enable_thinking": case["enable_thinking"],
        "parallel_tool_calls": case["parallel_tool_calls"],
        "tool_choice": case.get("tool_choice", "auto")}
    if "json_schema" in case:
        inputs["json_schema"] = json.dumps(case["json_schema"])
    return templates(case["template"], bos, eos).apply(inputs)


def stream_for(case: dict[str, Any], bos: str, eos: str) -> ChatStream:
    params = rendered(case["id"], bos, eos)
    return ChatStream({"format": params.format, "parser": params.parser,
                       "generation_prompt": params.generation_prompt,
                       "reasoning_format": case["reasoning_format"], "parse_tool_calls": True})


def pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start:start + size]


def feed(case: dict[str, Any], size: int | None, *, tokens: tuple[str, str] | None = None,
         ) -> tuple[list[ChatDiff], ChatMessage]:
    """Parse the case's output whole (``size`` None, final at once) or in pieces of ``size``
    characters, then an empty final feed; every difference and the last message. ``tokens``:
    BOS and EOS in place of the case's."""
    bos, eos = tokens if tokens is not None else (case["bos"], case["eos"])
    diffs: list[ChatDiff] = []
    with stream_for(case, bos, eos) as stream:
        if size is None:
            got, message = stream.feed(case["output"], final=True)
            return got, message
        for piece in pieces(case["output"], size):
            got, _ = stream.feed(piece)
            diffs += got
        got, message = stream.feed("", final=True)
    return diffs + got, message


def comparable(content: str, reasoning: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A message as test-chat.cpp compares two: content and reasoning stripped, arguments as
    JSON, ids exactly."""
    return {"content": content.strip(SPACE), "reasoning": reasoning.strip(SPACE),
            "tool_calls": [{"name": c["name"], "arguments": c["arguments"],
                            "id": c.get("id", "")} for c in calls]}


def assert_expected(case: dict[str, Any], message: ChatMessage) -> None:
    calls = [{"name": name, "arguments": json.loads(arguments), "id": call_id}
             for call_id, name, arguments in message.tool_calls]
    expect = case["expect"]
    assert comparable(message.content, message.reasoning, calls) == comparable(
        expect["content"], expect["reasoning"], expect["tool_calls"]), case["source"]


def added_up(diffs: list[ChatDiff]) -> ChatMessage:
    """The message the differences add up to, as test-chat.cpp adds them up: text deltas
    joined, each call's arguments joined, its name and id the last ones given."""
    content = "".join(d.content for d in diffs)
    reasoning = "".join(d.reasoning for d in diffs)
    calls: list[list[str]] = []
    for diff in (d for d in diffs if d.index >= 0):
        while len(calls) <= diff.index:
            calls.append(["", "", ""])
        call = calls[diff.index]
        call[0] = diff.id or call[0]
        call[1] = diff.name or call[1]
        call[2] += diff.arguments
    return ChatMessage(content, reasoning, tuple((i, n, a) for i, n, a in calls))


def assert_no_leak(case: dict[str, Any], content: str) -> None:
    """No tool-call syntax or called name in the content, unless the expected content has it."""
    expected = case["expect"]["content"]
    names = [call["name"] for call in case["expect"]["tool_calls"]]
    for text in case["markers"] + names:
        assert text not in content or text in expected, (text, content)


def params(cases: list[dict[str, Any]]) -> list[Any]:
    """The cases as pytest parameters; one that llama.cpp itself cannot parse with the model's
    tokens (its ``llama_cpp_defect`` says why) is expected to raise, strictly."""
    return [pytest.param(c, id=c["id"], marks=[pytest.mark.xfail(
        strict=True, raises=ChatParseError, reason=c["llama_cpp_defect"])]
        if "llama_cpp_defect" in c else []) for c in cases]


@pytest.mark.parametrize("case", params(CASES))
def test_whole_output(case: dict[str, Any]) -> None:
    diffs, message = feed(case, None)
    assert_expected(case, message)
    assert added_up(diffs) == message
    assert_no_leak(case, message.content)


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize("case", params(CASES))
def test_output_in_pieces(case: dict[str, Any], size: int) -> None:
    diffs, message = feed(case, size)
    if case["id"] in ID_AFTER_NAME and size < len(case["output"]):
        assert all(call[0] == "" for call in message.tool_calls)
        case = {**case, "expect": {**case["expect"], "tool_calls": [
            {**call, "id": ""} for call in case["expect"]["tool_calls"]]}}
    assert_expected(case, message)
    assert added_up(diffs) == message
    assert_no_leak(case, message.content)


#: calls whose output gives the id after the name: fed in pieces, the call keeps the id it
#: had when first seen (none: the server makes one), as llama-server's id cache does, so the
#: call is named once
ID_AFTER_NAME = frozenset({"mistral-nemo-call"})
CALL_CASES = [c for c in CASES if c["expect"]["tool_calls"] and "llama_cpp_defect" not in c]


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in CALL_CASES])
def test_each_call_is_named_once(case: dict[str, Any], size: int) -> None:
    """A streaming client that joins names gets each call's name: it comes in one diff."""
    diffs, message = feed(case, size)
    names: dict[int, list[str]] = defaultdict(list)
    for diff in diffs:
        if diff.index >= 0 and diff.name:
            names[diff.index].append(diff.name)
    assert [names[i] for i in range(len(message.tool_calls))] == [
        [name] for _, name, _ in message.tool_calls]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_as_test_chat_renders(case: dict[str, Any]) -> None:
    """With no BOS/EOS tokens, as test-chat.cpp builds its templates, every case parses."""
    _, message = feed(case, None, tokens=("", ""))
    assert_expected(case, message)


def test_the_cases_cover_each_shape() -> None:
    """Plain content, a call, parallel calls, reasoning with a call, reasoning alone, across
    the families of the pinned templates."""
    shapes = {(bool(c["expect"]["content"]), bool(c["expect"]["reasoning"]),
               min(len(c["expect"]["tool_calls"]), 2)) for c in CASES}
    assert {(True, False, 0), (False, False, 1), (False, False, 2), (False, True, 1),
            (False, True, 0)} <= shapes
    assert len({c["family"] for c in CASES}) >= 40


@pytest.mark.parametrize("case", params(CASES))
def test_the_served_parser_reads_the_same_message(case: dict[str, Any]) -> None:
    """ChatOutput (what every API streams from) gives the calls, content and reasoning of
    the case, fed in pieces of 5 characters, and finds no unfinished call in a finished one."""
    params_ = rendered(case["id"], case["bos"], case["eos"])
    out = ChatOutput(params_, reasoning_format=case["reasoning_format"],
                     tools=bool(case["tools"]))
    for piece in pieces(case["output"], 5):
        out.feed(piece)
    message = out.finish()
    calls = [{"name": c.name, "arguments": json.loads(c.arguments), "id": ""}
             for c in message.tool_calls]
    expect = case["expect"]
    assert comparable(message.content or "", message.reasoning_content or "", calls) == \
        comparable(expect["content"], expect["reasoning"],
                   [{**c, "id": ""} for c in expect["tool_calls"]]), case["source"]
