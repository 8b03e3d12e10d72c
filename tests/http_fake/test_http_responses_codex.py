"""What Codex sends to ``/v1/responses``, on the fake app: namespace tools (offered under joined
names, calls answered with ``namespace``), hosted tools (accepted, not offered), compaction by a
trailing ``compaction_trigger`` item (over HTTP, streamed, and continuing a socket's response),
and a recorded Codex session replayed frame by frame (``tests/fixtures/codex``: codex-cli
0.171.0 against ``python -m llamapy.serve``; the fake answers in the shapes the real server
answered and Codex accepted)."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
from fake_http import ALIAS, FakeApp, sse_events
from ws_helpers import BASE, URL, final, until_final

from llamapy.chat import Delta, ToolCallDelta
from llamapy.openai_api.responses_input import prepare_responses
from llamapy.openai_api.responses_output import ItemBuilder
from llamapy.openai_api.responses_params import COMPACTION_PREFIX
from llamapy.openai_api.responses_tools import Namespaces, offered_tools

FIXTURE = Path(__file__).parent.parent / "fixtures" / "codex" / "codex_0_171.json"
TRIGGER = {"type": "compaction_trigger"}
AGENTS = {"type": "namespace", "name": "multi_agent_v1",
          "description": "Tools for spawning and managing sub-agents.",
          "tools": [{"type": "function", "name": "close_agent", "description": "Close an agent.",
                     "parameters": {"type": "object",
                                    "properties": {"target": {"type": "string"}}}}]}
SHELL = {"type": "function", "name": "exec_command", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
HISTORY = [{"role": "user", "content": "Fix the failing test."},
           {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "It expects 3."}]},
           {"role": "user", "content": "Then change foo() to return 3."}]


@pytest.fixture(scope="module")
def app() -> Iterator[FakeApp]:
    """A fake app whose context holds Codex's prompts (its instructions and tools)."""
    with FakeApp(options={"n_ctx": 32768, "n_batch": 2048, "chunk_size": 512},
                 app_options={"n_predict": 8}) as served:
        yield served


def served_model(app: FakeApp) -> Any:
    return app.client.app.state.llamapy.served()  # type: ignore[attr-defined]


def prompt(app: FakeApp, **body: Any) -> str:
    return str(prepare_responses(served_model(app), {"input": HISTORY, **body}).chat.prompt)


def test_a_namespaces_functions_are_offered_under_joined_names(app: FakeApp) -> None:
    text = prompt(app, tools=[AGENTS])
    assert "multi_agent_v1.close_agent" in text
    assert "Tools for spawning and managing sub-agents." in text
    tools, spaces = offered_tools([AGENTS, SHELL])
    assert [tool.name for tool in tools] == ["multi_agent_v1.close_agent", "exec_command"]
    assert spaces.split("multi_agent_v1.close_agent") == ("close_agent", "multi_agent_v1")
    assert spaces.split("exec_command") == ("exec_command", None)


def test_a_call_to_a_namespaced_function_names_its_namespace() -> None:
    builder = ItemBuilder(namespaces=offered_tools([AGENTS])[1])
    builder.add(Delta(tool_call_deltas=[ToolCallDelta(
        index=0, id="call_1", name="multi_agent_v1.close_agent", arguments='{"target": "a1"}')]))
    builder.finish()
    assert builder.items[0]["name"] == "close_agent"
    assert builder.items[0]["namespace"] == "multi_agent_v1"
    plain = ItemBuilder(namespaces=Namespaces())
    plain.add(Delta(tool_call_deltas=[ToolCallDelta(index=0, id="c", name="exec_command")]))
    assert "namespace" not in plain.items[0]


def test_a_namespaced_call_sent_back_renders_as_it_was_generated(app: FakeApp) -> None:
    """A ``function_call`` item with ``namespace`` renders under the joined name (the tokens
    the model produced), so the conversation sent back reuses its KV."""
    def call(name: str, **more: Any) -> list[dict[str, Any]]:
        return [*HISTORY, {"type": "function_call", "call_id": "c1", "name": name,
                           "arguments": '{"target": "a1"}', **more},
                {"type": "function_call_output", "call_id": "c1", "output": "closed"}]
    served = served_model(app)
    split = prepare_responses(served, {"input": call("close_agent", namespace="multi_agent_v1"),
                                       "tools": [AGENTS]})
    joined = prepare_responses(served, {"input": call("multi_agent_v1.close_agent"),
                                        "tools": [AGENTS]})
    assert split.chat.token_ids == joined.chat.token_ids


def test_hosted_tools_are_accepted_and_not_offered(app: FakeApp) -> None:
    hosted = [{"type": "web_search", "external_web_access": False}, {"type": "file_search"}]
    assert prompt(app, tools=[*hosted, SHELL]) == prompt(app, tools=[SHELL])
    r = app.send("POST", "/v1/responses", json={**BASE, "input": "hi",
                                                "tools": [*hosted, SHELL]})
    assert r.status_code == 200, r.text
    assert r.json()["tools"] == [*hosted, SHELL]
    forced = app.send("POST", "/v1/responses", json={**BASE, "input": "hi", "tools": hosted,
                                                     "tool_choice": {"type": "web_search"}})
    assert forced.status_code == 400 and forced.json()["error"]["param"] == "web_search"


@pytest.mark.parametrize("tool", [
    {"type": "namespace", "name": "bad name", "tools": []},
    {"type": "namespace", "name": "ns", "tools": [{"type": "custom", "name": "patch"}]},
    {"type": "namespace", "name": "ns", "tools": "close"},
    {"type": "namespace", "name": "ns", "tools": [SHELL] * 200},
    {"type": "custom", "name": "apply_patch"},
])
def test_a_tool_we_cannot_offer_is_a_400(app: FakeApp, tool: dict[str, Any]) -> None:
    r = app.send("POST", "/v1/responses", json={**BASE, "input": "hi", "tools": [tool]})
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) >= {"message", "type", "param", "code"}


def summary_of(item: dict[str, Any]) -> str:
    text = item["encrypted_content"][len(COMPACTION_PREFIX):]
    return str(json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))["summary"])


def test_a_trailing_trigger_answers_one_compaction_item(app: FakeApp) -> None:
    r = app.send("POST", "/v1/responses", json={
        "input": [*HISTORY, TRIGGER], "tools": [SHELL], "store": False, "tool_choice": "auto",
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "codex-1"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["status"] == "completed"
    assert [item["type"] for item in body["output"]] == ["compaction"]
    assert summary_of(body["output"][0])
    assert body["usage"]["input_tokens"] > 0 and body["tools"] == [SHELL]
    app.check_idle()


def test_a_streamed_compaction_sends_the_item_then_completes(app: FakeApp) -> None:
    r = app.send("POST", "/v1/responses", json={"input": [*HISTORY, TRIGGER], "stream": True})
    assert r.status_code == 200, r.text
    events = [json.loads(data) for _, data in sse_events(r.text)]
    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.output_item.done", "response.completed"]
    assert [event["sequence_number"] for event in events] == list(range(5))
    assert events[-1]["response"]["output"] == [events[3]["item"]]


def test_a_trigger_with_nothing_before_it_is_a_400(app: FakeApp) -> None:
    r = app.send("POST", "/v1/responses", json={"input": [TRIGGER]})
    assert r.status_code == 400, r.text


def test_a_socket_compacts_its_own_response_and_goes_on_from_the_summary(app: FakeApp) -> None:
    with app.client.websocket_connect(URL) as ws:
        first = final(ws, input=HISTORY, store=False)
        compacted = final(ws, previous_response_id=first["id"], input=[TRIGGER], store=False)
        assert [item["type"] for item in compacted["output"]] == ["compaction"]
        go_on = final(ws, input=[HISTORY[0], *compacted["output"],
                                 {"role": "user", "content": "Go on."}], store=False)
        assert go_on["status"] in ("completed", "incomplete")
    app.check_idle()


# --- the recorded Codex session -----------------------------------------------------------


def recorded() -> list[dict[str, Any]]:
    """The recorded sockets (see the fixture's README)."""
    return list(json.loads(FIXTURE.read_text())["sockets"])


#: How a response ends (the fake's budget of 8 tokens may leave it incomplete).
ENDS = ("response.completed", "response.incomplete")


def folded(events: list[dict[str, Any]]) -> list[str]:
    return [kind for kind, _ in groupby(event["type"] for event in events)]


def replay(ws: Any, exchange: dict[str, Any], ids: dict[str, str]) -> list[dict[str, Any]]:
    """Send one recorded frame (our model, and the ids this replay's responses got)."""
    frame = copy.deepcopy(exchange["request"])
    frame["model"] = ALIAS
    if "previous_response_id" in frame:
        frame["previous_response_id"] = ids[frame["previous_response_id"]]
    ws.send_json(frame)
    return until_final(ws)


@pytest.mark.parametrize("index", range(len(recorded())))
def test_codex_s_recorded_frames_get_the_answers_codex_took(app: FakeApp, index: int) -> None:
    """Each recorded socket's frames, sent in order: every answer is the event sequence the
    real server sent (deltas folded), and the final response has the fields Codex reads."""
    ids: dict[str, str] = {}
    with app.client.websocket_connect(URL) as ws:
        for exchange in recorded()[index]["exchanges"]:
            events = replay(ws, exchange, ids)
            assert events[-1]["type"] in ENDS, events[-1]
            if exchange["answer"]:
                assert folded(events)[:-1] == exchange["answer"][:-1]
                ids[exchange["last"]["response"]["id"]] = events[-1]["response"]["id"]
            response = events[-1]["response"]
            usage = response["usage"]
            assert {"input_tokens", "output_tokens", "total_tokens"} <= set(usage)
            assert "cached_tokens" in usage["input_tokens_details"]
            if exchange["request"]["input"][-1].get("type") == "compaction_trigger":
                assert [item["type"] for item in response["output"]] == ["compaction"]
    app.check_idle()


def test_the_recording_holds_what_this_file_claims() -> None:
    """The fixture is Codex's: its WebSocket beta header, a prewarm continued by
    ``previous_response_id``, namespace and hosted tools, a compaction trigger and the turn
    after it that sends the compaction item back."""
    sockets = recorded()
    assert all(s["headers"]["openai-beta"].startswith("responses_websockets=")
               for s in sockets)
    frames = [e["request"] for s in sockets for e in s["exchanges"]]
    assert any(f.get("generate") is False for f in frames)
    assert any("previous_response_id" in f for f in frames)
    kinds = {tool["type"] for f in frames for tool in f["tools"]}
    assert {"function", "namespace", "web_search"} <= kinds
    items = [item.get("type") for f in frames for item in f["input"]]
    assert "compaction_trigger" in items and "compaction" in items


HOSTILE_TRIGGERS: dict[str, Any] = {
    "alone": {"input": [TRIGGER]},
    "after-a-number": {"input": [5, TRIGGER]},
    "tools-a-string": {"input": [*HISTORY, TRIGGER], "tools": "exec_command"},
    "too-many-in-a-namespace": {"input": [*HISTORY, TRIGGER], "tools": [
        {**AGENTS, "tools": AGENTS["tools"] * 129}]},
    "bad-effort": {"input": [*HISTORY, TRIGGER], "reasoning": {"effort": "maximal"}},
    "unknown-field": {"input": [*HISTORY, TRIGGER], "frobnicate": 1},
    "other-model": {"input": [*HISTORY, TRIGGER], "model": "gpt-5"},
    "unknown-previous": {"input": [TRIGGER], "previous_response_id": "resp_nope"},
    "trigger-with-fields": {"input": [*HISTORY, {**TRIGGER, "extra": 1}]},
    "long-history": {"input": [{"role": "user", "content": "y " * 40_000}, TRIGGER]},
}


@pytest.mark.parametrize("body", list(HOSTILE_TRIGGERS.values()), ids=list(HOSTILE_TRIGGERS))
def test_a_hostile_compaction_gets_a_4xx_over_http_and_the_socket(app: FakeApp,
                                                                  body: dict[str, Any]) -> None:
    r = app.send("POST", "/v1/responses", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert set(r.json()["error"]) >= {"message", "type", "param", "code"}
    with app.client.websocket_connect(URL) as ws:
        ws.send_json({"type": "response.create", **body})
        answer = until_final(ws)[-1]
        assert answer["type"] == "error" and 400 <= answer["status"] < 500, answer
        assert final(ws, input="still here?")["status"] in ENDS_STATUS
    app.check_idle()


#: A response's final status.
ENDS_STATUS = ("completed", "incomplete")


def test_a_namespaced_function_can_be_forced(app: FakeApp) -> None:
    """``tool_choice`` naming a namespace's function forces that call (its joined name)."""
    served = served_model(app)
    plan = prepare_responses(served, {"input": HISTORY, "tools": [AGENTS, SHELL],
                                      "tool_choice": {"type": "function", "name": "close_agent",
                                                      "namespace": "multi_agent_v1"}})
    assert plan.chat.tools_active
    grammar = str(plan.chat.intent.settings()["grammar"])
    assert "multi_agent_v1.close_agent" in grammar and "exec_command" not in grammar


def test_an_image_a_tool_returned_reaches_a_vision_model() -> None:
    """Codex's ``view_image`` answers with the image in ``function_call_output``: the tool
    message carries its text, the image follows in a user message (no template shows images in
    a tool message), and the encoder gets it."""
    from llamapy.media import FakeMediaEncoder
    from llamapy.media.samples import png

    url = "data:image/png;base64," + base64.b64encode(png(8, 8, (10, 200, 30))).decode()
    call = [{"role": "user", "content": "Look at a.png."},
            {"type": "function_call", "call_id": "c1", "name": "view_image",
             "arguments": '{"path": "a.png"}'},
            {"type": "function_call_output", "call_id": "c1",
             "output": [{"type": "input_text", "text": "a.png:"},
                        {"type": "input_image", "image_url": url}]}]
    with FakeApp(options={"mmproj": "fake"}) as vision:
        seen: list[int] = []
        media = vision.server._loop.media
        assert isinstance(media, FakeMediaEncoder)
        media.on_encode = lambda tenant, index: seen.append(index)
        r = vision.send("POST", "/v1/responses", json={"input": call, "max_output_tokens": 2})
        assert r.status_code == 200, r.text
        assert len(seen) == 1
        plan = prepare_responses(served_model(vision), {"input": call})
        assert plan.chat.prompt.index("a.png:") < plan.chat.prompt.index(
            "The image(s) the call c1 returned:")
        vision.check_idle()
    with FakeApp() as text_only:  # no projector: the image is refused, as in user input
        r = text_only.send("POST", "/v1/responses", json={"input": call})
        assert r.status_code == 400 and "no images" in r.json()["error"]["message"]
