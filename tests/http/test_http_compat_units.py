"""Unit tests of the Anthropic and Responses translations (no model): history conversion,
the polyfill for small templates, block and item building, error shapes, named SSE."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from llamapy.anthropic_api.blocks import BlockBuilder, signature, tool_use_id
from llamapy.anthropic_api.messages import stop_reason, usage_dict
from llamapy.anthropic_api.params import InputMessage, TextBlock
from llamapy.anthropic_api.prompt import chat_messages, system_text
from llamapy.chat import CHATML_TEMPLATE, Delta, ToolCallDelta
from llamapy.errors import (
    AuthenticationError,
    InvalidOptionError,
    ModelNotFoundError,
    NotReadyError,
    QueueFullError,
    RequestTimeoutError,
    UnknownOptionError,
    UnsupportedFeatureError,
)
from llamapy.openai_api.bridge import forward_extras, polyfill_history
from llamapy.openai_api.responses_input import chat_messages as response_messages
from llamapy.openai_api.responses_output import ItemBuilder
from llamapy.openai_api.responses_params import ResponsesBody, check_refused
from llamapy.serve.anthropic_errors import anthropic_error_body, anthropic_error_event
from llamapy.serve.routes.responses import responses_error_event
from llamapy.serve.sse_named import encode_named, named_event_stream

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


def anthropic(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    return chat_messages([InputMessage.model_validate(m) for m in messages])


def test_blocks_keep_their_order_as_chat_messages() -> None:
    out = anthropic(
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
            {"type": "tool_result", "tool_use_id": "t2", "is_error": True,
             "content": [{"type": "text", "text": "no"}, {"type": "text", "text": "way"}]},
            {"type": "text", "text": "thanks", "cache_control": {"type": "ephemeral"}}]},
    )
    assert out == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "hm",
         "tool_calls": [{"id": "t1", "type": "function",
                         "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: no\nway"},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
    ]


@pytest.mark.parametrize(("content", "error"), [
    ([{"type": "search_result", "source": "x"}], UnsupportedFeatureError),
    ([{"type": "tool_result", "tool_use_id": "t",
       "content": [{"type": "search_result", "source": "x"}]}], UnsupportedFeatureError),
    ([{"type": "thinking", "thinking": "x"}], InvalidOptionError),
    ([{"text": "no type"}], InvalidOptionError),
    ([{"type": "tool_use", "id": "t", "name": "f"}, {"type": "nope"}], UnsupportedFeatureError),
])
def test_bad_blocks_raise_typed_errors(content: list, error: type[Exception]) -> None:
    with pytest.raises(error):
        anthropic({"role": "user", "content": content})


def test_image_blocks_become_image_url_parts() -> None:
    """An image (base64 or url source) in a user turn or a tool result becomes an OpenAI
    ``image_url`` part, which the media layer decodes (a remote url is refused there); an
    image in an assistant turn is a 400."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}
    out = anthropic({"role": "user", "content": [{"type": "text", "text": "see"}, image]})
    assert out[-1]["content"][1] == {"type": "image_url",
                                     "image_url": {"url": "data:image/png;base64,AAAA"}}
    remote = anthropic({"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x"}}]})
    assert remote[-1]["content"][0]["image_url"]["url"] == "http://x"
    with pytest.raises(InvalidOptionError):
        anthropic({"role": "assistant", "content": [image]})


def test_system_text_blanks_the_billing_stamp() -> None:
    header = "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You are Claude Code."
    other = header.replace("a5145", "9f3e0")
    assert system_text(header) == system_text(other)
    assert system_text(header).endswith("cch=00000;You are Claude Code.")
    assert system_text("keep cch=a5145; here") == "keep cch=a5145; here"
    blocks = [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    assert system_text([TextBlock.model_validate(b) for b in blocks]) == "A\nB"


def test_polyfill_inlines_what_the_template_cannot_show() -> None:
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "reasoning_content": "r",
                 "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "one"},
                {"role": "tool", "tool_call_id": "c2", "content": "two"}]
    out = polyfill_history(CHATML_TEMPLATE, messages)
    assert out[1] == {"role": "assistant", "content": '<think>\nr\n</think>\n\n<tool_call>\n'
                      '{"name": "f", "arguments": {"a": 1}}\n</tool_call>'}
    assert out[2:] == [{"role": "user", "content": "<tool_response>\none\n</tool_response>\n"
                        "<tool_response>\ntwo\n</tool_response>"}]
    assert polyfill_history("{{ m.reasoning_content }} {{ m.tool_calls }}", messages) == messages
    assert messages[1]["tool_calls"] == [CALL]  # inputs untouched


def test_block_builder_indices_and_final_blocks() -> None:
    builder = BlockBuilder()
    events = builder.add(Delta(reasoning="think"))
    events += builder.add(Delta(reasoning=" more", content="Hi"))
    events += builder.add(Delta(tool_call_deltas=[
        ToolCallDelta(index=0, id="call_abc", name="f"), ToolCallDelta(index=0, arguments='{"a"')]))
    events += builder.add(Delta(tool_call_deltas=[ToolCallDelta(index=0, arguments=": 1}")]))
    events += builder.finish()
    kinds = [(e["type"], e.get("index"), e.get("delta", {}).get("type")) for e in events]
    assert kinds == [
        ("content_block_start", 0, None), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0,
                                                       "signature_delta"),
        ("content_block_stop", 0, None), ("content_block_start", 1, None),
        ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, None), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"), ("content_block_stop", 2, None),
    ]
    assert builder.blocks == [
        {"type": "thinking", "thinking": "think more", "signature": signature("think more")},
        {"type": "text", "text": "Hi"},
        {"type": "tool_use", "id": "toolu_abc", "name": "f", "input": {"a": 1}},
    ]
    assert events[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert builder.has_tool_use and tool_use_id("call_xyz") == "toolu_xyz"


def test_stop_reasons_and_usage() -> None:
    assert stop_reason("stop", "END", False) == ("stop_sequence", "END")
    assert stop_reason("max_tokens", "", True) == ("max_tokens", None)
    assert stop_reason("eog", "", True) == ("tool_use", None)
    assert stop_reason("eog", "", False) == ("end_turn", None)
    usage = usage_dict(100, 60, 7)
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == 100
    assert (usage["cache_read_input_tokens"], usage["output_tokens"]) == (60, 7)


def test_item_builder_events_and_items() -> None:
    builder = ItemBuilder(encrypt_reasoning=True)
    events = builder.add(Delta(reasoning="r", content="Hi"))
    events += builder.add(Delta(tool_call_deltas=[
        ToolCallDelta(index=0, id="call_1", name="f"), ToolCallDelta(index=0, arguments="{}")]))
    events += builder.finish("incomplete")
    names = [e["type"] for e in events]
    assert names.count("response.output_item.added") == 3
    assert names.count("response.output_item.done") == 3
    assert [e["output_index"] for e in events if e["type"].startswith("response.output_item")] \
        == [0, 0, 1, 1, 2, 2]
    reasoning, message, call = builder.items
    assert reasoning["content"][0]["text"] == reasoning["encrypted_content"] == "r"
    assert message["content"][0]["text"] == "Hi" and message["status"] == "completed"
    assert (call["call_id"], call["arguments"], call["status"]) == ("call_1", "{}", "incomplete")
    assert all(e["item_id"] == call["id"] for e in events
               if e["type"].startswith("response.function_call_arguments"))


def test_response_items_form_assistant_turns() -> None:
    body = ResponsesBody.model_validate({"instructions": "sys", "input": [
        {"role": "developer", "content": "dev"},
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "a"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_text", "text": "out"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": "e"},
    ]})
    assert response_messages(body) == [
        {"role": "system", "content": "sys"}, {"role": "system", "content": "dev"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "s",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
        {"role": "assistant", "content": "", "reasoning_content": "e"},
    ]


@pytest.mark.parametrize("fields", [{"previous_response_id": "r"}, {"background": True},
                                    {"truncation": "auto"}, {"top_logprobs": 2},
                                    {"conversation": "c"}])
def test_refused_response_fields(fields: dict) -> None:
    with pytest.raises(UnsupportedFeatureError):
        check_refused(ResponsesBody.model_validate({"input": "x", **fields}))
    check_refused(ResponsesBody.model_validate({"input": "x", "store": False,
                                                "truncation": "disabled"}))


def test_forward_extras() -> None:
    assert forward_extras({"min_p": 0.1, "top_k": 5}, fields=["model"]) == {"min_p": 0.1,
                                                                            "top_k": 5}
    with pytest.raises(UnknownOptionError):
        forward_extras({"temprature": 1}, fields=["model"])
    with pytest.raises(UnknownOptionError):
        forward_extras({"stop": ["x"]}, fields=["model"], owned=["stop"])


@pytest.mark.parametrize(("exc", "status", "kind"), [
    (InvalidOptionError("x"), 400, "invalid_request_error"),
    (AuthenticationError("x"), 401, "authentication_error"),
    (ModelNotFoundError("x"), 404, "not_found_error"),
    (QueueFullError(4), 429, "rate_limit_error"),
    (NotReadyError("x"), 503, "overloaded_error"),
    (RequestTimeoutError("x"), 504, "timeout_error"),
    (RuntimeError("x"), 500, "api_error"),
])
def test_anthropic_error_shape(exc: Exception, status: int, kind: str) -> None:
    assert anthropic_error_body(exc) == (status, {"type": "error", "error": {
        "type": kind, "message": anthropic_error_body(exc)[1]["error"]["message"]}})
    assert anthropic_error_event(exc)["error"]["type"] == kind


def test_named_stream_reports_a_late_error_as_an_event() -> None:
    async def events() -> AsyncGenerator[dict[str, Any], None]:
        yield {"type": "message_start", "n": 1}
        raise QueueFullError(2)

    async def a(request: Request) -> Response:
        return await named_event_stream(request, events(), error_event=anthropic_error_event)

    async def r(request: Request) -> Response:
        return await named_event_stream(request, events(), error_event=responses_error_event)

    app = Starlette(routes=[Route("/a", a), Route("/r", r)])

    with TestClient(app) as http:
        lines = http.get("/a").text.strip().split("\n")
        assert lines[0] == "event: message_start" and lines[-2] == "event: error"
        assert json.loads(lines[-1].removeprefix("data: "))["error"]["type"] == "rate_limit_error"
        last = json.loads(http.get("/r").text.strip().split("\n")[-1].removeprefix("data: "))
        assert (last["type"], last["code"], last["sequence_number"]) == ("error",
                                                                          "rate_limit_exceeded", 1)
    assert encode_named({"type": "ping"}) == b'event: ping\ndata: {"type": "ping"}\n\n'
