"""``POST /v1/responses/compact`` on the fake backend: the answer's shape (as the official
client parses it), the history's KV reused by the summarising run, Codex's body, the compacted
history fed back to ``/v1/responses`` (the summary rendered the same every time), the retry when
the model calls a tool, the budget near the context's end, and hostile bodies (a 4xx in the
OpenAI shape, never a 500)."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fake_http import FakeApp, fake_app
from openai._models import construct_type
from openai.types.responses.compacted_response import CompactedResponse
from openai.types.responses.response_compaction_item import ResponseCompactionItem

from llamapy.openai_api import responses_compact
from llamapy.openai_api.responses_compact import (
    SUMMARY_INSTRUCTION,
    SUMMARY_TOKENS,
    CompactBody,
    compact_response,
    conversation,
    summary_plan,
)
from llamapy.openai_api.responses_input import SUMMARY_HEADING, prepare_responses
from llamapy.openai_api.responses_params import COMPACTION_PREFIX, compaction_content
from llamapy.openai_api.target import ServedModel
from llamapy.serve.routes.responses_compact import compact_router

SHELL = {"type": "function", "name": "shell", "description": "Run a shell command",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                        "required": ["cmd"]}}
INSTRUCTIONS = "You are a coding agent. Work in the repository."
HISTORY = [
    {"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": "Fix the failing test in tests/test_foo.py"}]},
    {"type": "reasoning", "summary": [], "encrypted_content": "I should run the tests first."},
    {"type": "function_call", "call_id": "call_1", "name": "shell",
     "arguments": "{\"cmd\": \"pytest -q tests/test_foo.py\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "1 failed: assert 2 == 3"},
    {"type": "message", "role": "assistant",
     "content": [{"type": "output_text", "text": "The test expects 3.", "annotations": []}]},
    {"role": "user", "content": "Then change foo() to return 3."},
]
_scopes = itertools.count()


@pytest.fixture(scope="module")
def app() -> Iterator[FakeApp]:
    """The fake app (a context large enough for the tool section and the instruction) with
    the compact routes."""
    with fake_app(options={"n_ctx": 8192}) as served:
        starlette: Any = served.client.app
        starlette.router.routes[0:0] = compact_router(starlette.state.llamapy).routes
        yield served


def served_model(app: FakeApp) -> ServedModel:
    """The app's served model (the library functions' target)."""
    return app.client.app.state.llamapy.served()  # type: ignore[attr-defined,no-any-return]


def scope() -> str:
    """A cache scope of its own for one test (no KV from another test)."""
    return f"compact-{next(_scopes)}"


def compact(app: FakeApp, body: dict[str, Any], path: str = "/v1/responses/compact"
            ) -> dict[str, Any]:
    """A compact request that must succeed."""
    r = app.send("POST", path, json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def summary_of(item: dict[str, Any]) -> str:
    """The summary a compaction item carries (decoded as a client could)."""
    content = item["encrypted_content"]
    assert content.startswith(COMPACTION_PREFIX)
    text = content[len(COMPACTION_PREFIX):]
    decoded = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    assert set(decoded) == {"summary"} and isinstance(decoded["summary"], str)
    return str(decoded["summary"])


def test_the_answer_is_the_user_messages_and_one_compaction_item(app: FakeApp) -> None:
    body = {"model": "fake", "input": HISTORY, "instructions": INSTRUCTIONS,
            "cache_scope": scope()}
    for path in ("/v1/responses/compact", "/responses/compact"):
        out = compact(app, body, path)
        assert out["id"].startswith("resp_") and out["object"] == "response.compaction"
        assert isinstance(out["created_at"], int)
        *users, last = out["output"]
        assert [m["content"] for m in users] == [
            [{"type": "input_text", "text": "Fix the failing test in tests/test_foo.py"}],
            [{"type": "input_text", "text": "Then change foo() to return 3."}]]
        assert all(m["type"] == "message" and m["role"] == "user" and m["id"].startswith("msg_")
                   for m in users)
        assert last["type"] == "compaction" and last["id"].startswith("cmp_")
        assert summary_of(last)
        usage = out["usage"]
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
        assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
        parsed = construct_type(type_=CompactedResponse, value=out)  # as the client reads it
        assert isinstance(parsed, CompactedResponse)
        assert isinstance(parsed.output[-1], ResponseCompactionItem)
        assert parsed.usage.input_tokens_details.cached_tokens >= 0
    app.check_idle()


def test_a_string_input_is_one_user_message(app: FakeApp) -> None:
    out = compact(app, {"input": "Rename bar to baz.", "cache_scope": scope()})
    assert [item["type"] for item in out["output"]] == ["message", "compaction"]
    assert out["output"][0]["content"] == [{"type": "input_text", "text": "Rename bar to baz."}]


def test_the_summarising_run_reuses_the_historys_kv(app: FakeApp) -> None:
    """Compacting right after a turn reuses that turn's whole prompt (instructions, tools and
    history render as on the turn); under another salt nothing is reused."""
    common = {"instructions": INSTRUCTIONS, "tools": [SHELL], "prompt_cache_key": "agent-1",
              "cache_scope": scope()}
    turn = app.send("POST", "/v1/responses",
                    json={**common, "input": HISTORY, "max_output_tokens": 8})
    assert turn.status_code == 200, turn.text
    history = [*HISTORY, *turn.json()["output"]]
    out = compact(app, {**common, "input": history})
    cached = out["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached >= turn.json()["usage"]["input_tokens"]
    assert out["usage"]["input_tokens"] > cached  # the instruction is new
    salted = compact(app, {**common, "input": history, "cache_salt": "elsewhere"})
    assert salted["usage"]["input_tokens_details"]["cached_tokens"] == 0
    app.check_idle()


def test_codex_s_body_is_accepted(app: FakeApp) -> None:
    """What Codex sends: its base instructions, tools, reasoning, text, an earlier
    compaction item (under Codex's other type name) among the history."""
    earlier = {"type": "compaction_summary", "encrypted_content": compaction_content("Earlier.")}
    body = {"model": "fake", "input": [earlier, *HISTORY], "instructions": INSTRUCTIONS,
            "tools": [SHELL], "parallel_tool_calls": False,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "text": {"verbosity": "low"}, "prompt_cache_key": "codex-session",
            "prompt_cache_retention": "in_memory", "service_tier": "auto",
            "safety_identifier": "user-1", "cache_scope": scope()}
    out = compact(app, body)
    assert [item["type"] for item in out["output"]] == ["message", "message", "compaction"]
    app.check_idle()


def test_the_compacted_history_feeds_the_next_turn(app: FakeApp) -> None:
    """The output sent back as input renders the summary as one user message, the same text
    every time (so its KV is reused on the next turn)."""
    common = {"instructions": INSTRUCTIONS, "cache_scope": scope()}
    out = compact(app, {**common, "input": HISTORY})
    summary = summary_of(out["output"][-1])
    nxt = [*out["output"], {"role": "user", "content": "Go on."}]
    first = app.send("POST", "/v1/responses", json={**common, "input": nxt,
                                                     "max_output_tokens": 4})
    assert first.status_code == 200, first.text
    again = app.send("POST", "/v1/responses", json={**common, "input": nxt,
                                                     "max_output_tokens": 4})
    assert again.json()["usage"]["input_tokens"] == first.json()["usage"]["input_tokens"]
    assert (again.json()["usage"]["input_tokens_details"]["cached_tokens"]
            >= first.json()["usage"]["input_tokens"] - 1)
    plan = prepare_responses(served_model(app), {**common, "input": nxt})
    assert SUMMARY_HEADING + summary in plan.chat.prompt
    spelled = [*nxt[:-2], {"role": "user", "content": SUMMARY_HEADING + summary}, nxt[-1]]
    assert prepare_responses(served_model(app), {**common, "input": spelled}).chat.token_ids \
        == plan.chat.token_ids
    app.check_idle()


def test_the_official_clients_items_feed_the_next_turn(app: FakeApp) -> None:
    """``[item.model_dump() for item in compacted.output]`` (the client's objects, with their
    ``None`` fields) is a valid input."""
    out = compact(app, {"input": HISTORY, "cache_scope": scope()})
    parsed = construct_type(type_=CompactedResponse, value=out)
    items = [item.model_dump(warnings=False) for item in parsed.output]
    r = app.send("POST", "/v1/responses", json={
        "input": [*items, {"role": "user", "content": "Go on."}], "max_output_tokens": 4})
    assert r.status_code == 200, r.text


CALL = '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>'


def test_a_tool_call_instead_of_a_summary_is_asked_again_without_tools(
        app: FakeApp, monkeypatch: pytest.MonkeyPatch) -> None:
    real = responses_compact.arun_plan
    offered: list[bool] = []

    async def first_run_calls(plan: Any, observe: Any = None) -> Any:
        completion = await real(plan, observe)
        offered.append(plan.tools_active)
        return dataclasses.replace(completion, text=CALL) if len(offered) == 1 else completion

    monkeypatch.setattr(responses_compact, "arun_plan", first_run_calls)
    out = compact(app, {"input": HISTORY, "tools": [SHELL], "cache_scope": scope()})
    assert offered == [True, False]
    assert summary_of(out["output"][-1]) and "<tool_call>" not in summary_of(out["output"][-1])
    single = compact(app, {"input": HISTORY, "cache_scope": scope()})  # no tools: one run
    assert offered == [True, False, False]
    assert out["usage"]["input_tokens"] > single["usage"]["input_tokens"]  # both runs counted
    app.check_idle()


def test_the_budget_is_capped_and_shrinks_near_the_contexts_end(app: FakeApp) -> None:
    served = served_model(app)
    body = CompactBody.model_validate({"input": HISTORY})
    plan = summary_plan(served, body, conversation(body), tools=True)
    assert plan.chat.intent.options.max_tokens == min(SUMMARY_TOKENS, served.n_ctx_seq() // 4)
    assert plan.chat.prompt.rstrip().endswith("<|im_start|>assistant")
    assert SUMMARY_INSTRUCTION in plan.chat.prompt and plan.chat.intent.options.sampling.temp == 0
    room = served.n_ctx_seq() - len(plan.chat.token_ids)
    filler = "x" * (room - 40)  # (byte tokens: one a character)
    out = compact(app, {"input": [{"role": "user", "content": filler}, *HISTORY],
                        "cache_scope": scope()})
    assert out["usage"]["output_tokens"] <= 40
    app.check_idle()


def test_the_library_function_compacts_too(app: FakeApp) -> None:
    out = compact_response(served_model(app), {"input": HISTORY, "cache_scope": scope()})
    assert out["object"] == "response.compaction"
    assert out["output"][-1]["type"] == "compaction"


def _b64(data: bytes) -> str:
    return COMPACTION_PREFIX + base64.urlsafe_b64encode(data).decode().rstrip("=")


FORGED = {
    "openai": "gAAAAABoOpaqueContentOfAnotherServer==",
    "not-base64": COMPACTION_PREFIX + "***",
    "not-json": _b64(b"summary"),
    "not-an-object": _b64(b'["summary"]'),
    "no-summary": _b64(b'{"text": "x"}'),
    "summary-not-text": _b64(b'{"summary": 5}'),
    "deep": _b64(b"[" * 100_000),
    "not-utf8": _b64(b'{"summary": "\xff\xfe"}'),
}


@pytest.mark.parametrize("path", ["/v1/responses/compact", "/v1/responses"])
@pytest.mark.parametrize("content", list(FORGED.values()), ids=list(FORGED))
def test_a_forged_compaction_item_is_a_400_naming_it(app: FakeApp, path: str, content: str
                                                     ) -> None:
    item = {"type": "compaction", "encrypted_content": content}
    r = app.send("POST", path, json={"input": [{"role": "user", "content": "hi"}, item]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "input[1].encrypted_content"


HOSTILE: dict[str, Any] = {
    "not-an-object": [1, 2],
    "no-input": {"model": "fake"},
    "empty-input": {"input": []},
    "input-a-number": {"input": 5},
    "item-a-number": {"input": [5]},
    "unknown-item": {"input": [{"type": "web_search_call", "id": "ws_1"}]},
    "compaction-without-content": {"input": [{"type": "compaction"}]},
    "content-a-number": {"input": [{"type": "compaction", "encrypted_content": 5}]},
    "tools-a-string": {"input": "hi", "tools": "shell"},
    "bad-tool": {"input": "hi", "tools": [{"type": "custom", "name": "apply_patch"}]},
    "bad-effort": {"input": "hi", "reasoning": {"effort": "maximal"}},
    "bad-retention": {"input": "hi", "prompt_cache_retention": "forever"},
    "previous-response": {"input": "hi", "previous_response_id": "resp_1"},
    "stream": {"input": "hi", "stream": True},
    "own-temperature": {"input": "hi", "temperature": 1.0},
    "own-budget": {"input": "hi", "max_output_tokens": 5},
    "unknown-field": {"input": "hi", "frobnicate": 1},
    "other-model": {"input": "hi", "model": "gpt-5"},
    "too-long": {"input": "y" * 20_000},
    "many-items": {"input": [{"role": "user", "content": "x"}] * 5_000},
}


@pytest.mark.parametrize("body", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_bodies_get_a_4xx_in_the_openai_shape(app: FakeApp, body: Any) -> None:
    r = app.send("POST", "/v1/responses/compact", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert set(r.json()["error"]) >= {"message", "type", "param", "code"}
    assert app.alive


def test_named_params_point_at_the_field(app: FakeApp) -> None:
    cases = {"previous-response": "previous_response_id", "stream": "stream",
             "no-input": "input", "item-a-number": "input",
             "compaction-without-content": "input[0]"}
    for name, param in cases.items():
        r = app.send("POST", "/v1/responses/compact", json=HOSTILE[name])
        assert r.json()["error"]["param"] == param, (name, r.text)
    app.check_idle()


def test_a_body_over_the_size_limit_is_a_413(app: FakeApp) -> None:
    limit = 16 * 1024 * 1024
    r = app.send("POST", "/v1/responses/compact", content=b'{"input": "' + b"y" * limit + b'"}',
                 headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text[:200]
    assert "error" in r.json()
