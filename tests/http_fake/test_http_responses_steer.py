"""Steering on the Responses WebSocket (fake app): ``response.steer`` is answered at once,
accepted or failed with its reason; a steered running response is followed by its successor,
which continues it on its KV; one that ends waiting for tool results parks the input for the
client's continuation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fake_http import FakeApp, keyed_app
from test_http_tenants import KEYS_FILE
from ws_helpers import BASE, FINAL, final, post, run, socket, until_final

from llamapy.serve.routes import responses_ws
from llamapy.serve.routes.responses_steer import MAX_STEERS, Steering


@pytest.fixture(scope="module")
def app() -> Iterator[FakeApp]:
    with keyed_app(KEYS_FILE) as served:
        yield served


STEER = {"type": "response.steer", "input": [{"role": "user", "content": "also"}]}


@pytest.mark.parametrize("change, code", [
    ({"input": [{"role": "assistant", "content": "x"}]}, "invalid_input"),
    ({"input": [{"role": "user", "content": "x", "name": "n"}]}, "invalid_input"),
    ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
     "invalid_input"),
    ({"input": []}, "invalid_input"), ({"input": ""}, "invalid_input"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
     "invalid_input"),
    ({"stream_id": "lane"}, "invalid_input"), ({"previous_response_id": 3}, "invalid_input"),
    ({}, "response_not_found"),
])
def test_a_steer_that_cannot_be_queued_fails_with_its_reason(
        app: FakeApp, change: dict[str, Any], code: str) -> None:
    with socket(app.client) as ws:
        steer = {**STEER, "previous_response_id": "resp_nope", **change}
        ws.send_json(steer)
        failed = ws.receive_json()
        assert failed["type"] == "response.steer.failed", failed
        assert failed["error"]["code"] == code and failed["error"]["type"] == (
            "invalid_request_error")
        assert failed["steer"] == {k: v for k, v in steer.items() if k != "type"}
        assert run(ws, input="hi")[-1]["type"] in FINAL[:2]  # the socket lives on
    app.check_idle()


def test_a_response_takes_a_bounded_number_of_steers_and_none_with_a_conversation() -> None:
    steering = Steering()
    steering.start("resp_a", "lane", {"input": "x"})
    frame = {**STEER, "previous_response_id": "resp_a"}
    answers = [steering.steer(frame, lambda _: False) for _ in range(MAX_STEERS + 1)]
    assert [a["type"] for a in answers] == ["response.steer.accepted"] * MAX_STEERS + [
        "response.steer.failed"]
    assert answers[-1]["error"]["code"] == "too_many_pending_steers"
    assert len({a["steer"]["id"] for a in answers[:-1]}) == MAX_STEERS
    assert steering.stop() is not None
    finished = steering.steer(frame, lambda response_id: response_id == "resp_a")
    assert finished["error"]["code"] == "response_already_completed"
    steering.start("resp_b", None, {"input": "x", "conversation": "conv_1"})
    bound = steering.steer({**frame, "previous_response_id": "resp_b"}, lambda _: False)
    assert bound["error"]["code"] == "steering_not_supported"


def test_steering_a_finished_response_fails(app: FakeApp) -> None:
    with socket(app.client) as ws:
        done = final(ws, input="hi", store=False)
        ws.send_json({**STEER, "previous_response_id": done["id"]})
        failed = ws.receive_json()
    assert failed["type"] == "response.steer.failed"
    assert failed["error"]["code"] == "response_already_completed"
    app.check_idle()


def steered(ws: Any, monkeypatch: pytest.MonkeyPatch | None = None
            ) -> tuple[list[dict[str, Any]], str]:
    """A slow response on lane ``lane`` with a steer sent once it was created: the events up
    to its final one and the id of the response."""
    ws.send_json({"type": "response.create", **BASE, "input": "tell a story", "store": False,
                  "max_output_tokens": 40, "ignore_eos": True, "stream_id": "lane"})
    events = [ws.receive_json()]
    assert events[0]["type"] == "response.created"
    first_id = events[0]["response"]["id"]
    ws.send_json({**STEER, "input": "make it short", "previous_response_id": first_id})
    events += until_final(ws)
    return events, first_id


def test_steering_a_running_response_starts_its_successor() -> None:
    # 40 tokens at 30 ms each: the response still runs when the steer arrives
    with FakeApp(options={"n_ctx": 8192, "sleep_s": 0.03}) as slow:
        with socket(slow.client, key="") as ws:
            first, first_id = steered(ws)
            successor = until_final(ws)
        accepted = [e for e in first if e["type"] == "response.steer.accepted"]
        assert len(accepted) == 1 and accepted[0]["stream_id"] == "lane"
        assert accepted[0]["steer"]["previous_response_id"] == first_id
        assert accepted[0]["steer"]["id"].startswith("steer_")
        assert [e["sequence_number"] for e in first] == list(range(len(first)))
        assert successor[0]["type"] == "response.created"
        assert {e["stream_id"] for e in successor} == {"lane"}
        done = successor[-1]["response"]
        assert done["previous_response_id"] == first_id and done["store"] is False
        whole = [{"role": "user", "content": "tell a story"}, *first[-1]["response"]["output"],
                 {"role": "user", "content": "make it short"}]
        resent = post(slow, input=whole, max_output_tokens=1, store=False)
        assert done["usage"]["input_tokens"] == resent["usage"]["input_tokens"]
        assert done["usage"]["input_tokens_details"]["cached_tokens"] >= (
            first[-1]["response"]["usage"]["input_tokens"])
        assert done["usage"]["output_tokens"] == 40  # the settings carried over
        slow.check_idle()


def test_steering_a_response_that_waits_for_tool_results_waits_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stub = [{"type": "function_call_output", "call_id": "call_1", "name": "get_weather"}]
    monkeypatch.setattr(responses_ws, "required_input", lambda response: stub)
    with FakeApp(options={"n_ctx": 8192, "sleep_s": 0.03}) as slow:
        with socket(slow.client, key="") as ws:
            first, first_id = steered(ws)
            pending = ws.receive_json()
            assert pending["type"] == "response.steer.pending", pending
            assert pending["reason"] == "waiting_for_required_input"
            assert pending["required_input"] == stub and pending["stream_id"] == "lane"
            assert pending["steer"]["previous_response_id"] == first_id
            going = final(ws, input="here you are", previous_response_id=first_id,
                          store=False)
        whole = [{"role": "user", "content": "tell a story"}, *first[-1]["response"]["output"],
                 {"role": "user", "content": "make it short"},
                 {"role": "user", "content": "here you are"}]
        resent = post(slow, input=whole, max_output_tokens=1, store=False)
        assert going["usage"]["input_tokens"] == resent["usage"]["input_tokens"]
        slow.check_idle()
