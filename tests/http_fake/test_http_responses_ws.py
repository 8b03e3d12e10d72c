"""The Responses WebSocket (``ws /v1/responses``) on the fake app: a ``response.create`` streams
what a streamed ``POST /v1/responses`` streams; a socket continues its own responses with only
the new input (``store: false`` too), at the cost of resending the conversation and on its KV;
``generate: false`` prepares state; every bad frame is an ``error`` event and the socket lives
on; the handshake checks the key and the page's ``Origin``; a closed socket frees its slot. And
the official client's ``responses.connect()`` against uvicorn."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai
import pytest
import uvicorn
from fake_http import (
    ALIAS,
    SERVER_OPTIONS,
    FakeApp,
    keyed_app,
    sse_events,
    submitted_options,
)
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from test_http_tenants import KEYS_FILE
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from ws_helpers import (
    BASE,
    FINAL,
    START_S,
    URL,
    auth,
    final,
    post,
    refusal,
    run,
    socket,
    until_final,
)

from llamapy.openai_api.responses_socket import SocketMemory
from llamapy.serve import create_app
from llamapy.serve.routes import responses_ws
from llamapy.serve.tenants import KeyTable
from llamapy.server import ModelManager, ModelSpec
from llamapy.server.fake import fake_server


@pytest.fixture(scope="module")
def app() -> Iterator[FakeApp]:
    with keyed_app(KEYS_FILE) as served:
        yield served


def test_a_create_streams_what_a_streamed_post_streams(app: FakeApp) -> None:
    r = app.send("POST", "/v1/responses", json={**BASE, "input": "hello", "stream": True},
                 headers=auth())
    posted = [json.loads(data) for _, data in sse_events(r.text)]
    with socket(app.client) as ws:
        events = run(ws, input="hello", stream_id="lane-1",
                     client_metadata={"x-codex-turn": "1"})  # Codex's, ignored
    assert [e["type"] for e in events] == [e["type"] for e in posted]
    assert events[0]["type"] == "response.created"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert {e["stream_id"] for e in events} == {"lane-1"}
    done = events[-1]["response"]

    def texts(response: dict[str, Any]) -> list[Any]:
        return [item.get("content") for item in response["output"]]

    assert texts(done) == texts(posted[-1]["response"])
    assert done["store"] is True
    got = app.send("GET", f"/v1/responses/{done['id']}", headers=auth()).json()
    assert got["id"] == done["id"]
    app.check_idle()


def test_a_continuation_costs_what_resending_costs_and_reuses_the_kv(app: FakeApp) -> None:
    with socket(app.client) as ws:
        first = final(ws, input="tell me about the tides", instructions="be brief")
        second = final(ws, input="and the moon?", instructions="be brief",
                       previous_response_id=first["id"])
    assert second["previous_response_id"] == first["id"]
    whole = [{"role": "user", "content": "tell me about the tides"}, *first["output"],
             {"role": "user", "content": "and the moon?"}]
    resent = post(app, input=whole, instructions="be brief", store=False)
    assert second["usage"]["input_tokens"] == resent["usage"]["input_tokens"]
    cached = second["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached >= 0.8 * first["usage"]["input_tokens"]
    app.check_idle()


def test_store_false_continues_on_its_own_socket_only(app: FakeApp) -> None:
    with socket(app.client) as ws:
        first = final(ws, input="count the waves", store=False)
        second = final(ws, input="and again", store=False, previous_response_id=first["id"])
        third = final(ws, input="once more", store=False, previous_response_id=second["id"])
    assert first["store"] is False and second["previous_response_id"] == first["id"]
    assert third["previous_response_id"] == second["id"]
    whole = [{"role": "user", "content": "count the waves"}, *first["output"],
             {"role": "user", "content": "and again"}, *second["output"],
             {"role": "user", "content": "once more"}]
    assert third["usage"]["input_tokens"] == post(app, input=whole, store=False)["usage"][
        "input_tokens"]
    assert third["usage"]["input_tokens_details"]["cached_tokens"] >= (
        second["usage"]["input_tokens"])  # the second turn's prompt, from its KV
    assert app.send("GET", f"/v1/responses/{first['id']}", headers=auth()).status_code == 404
    with socket(app.client) as ws:  # another socket does not know it
        refused = run(ws, input="and again", previous_response_id=second["id"])[-1]
        assert refused["type"] == "error" and refused["status"] == 404
        assert refused["error"]["code"] == "previous_response_not_found"
        assert final(ws, input="still here")["status"] in ("completed", "incomplete")
    app.check_idle()


def test_a_socket_chain_keeps_its_slot_affinity(app: FakeApp) -> None:
    with socket(app.client) as ws:
        first = final(ws, input="start", store=False)
        with submitted_options(app) as seen:
            second = final(ws, input="go on", store=False, previous_response_id=first["id"])
            final(ws, input="and on", store=False, previous_response_id=second["id"])
    assert [options.session for options in seen] == [first["id"], first["id"]]
    assert not any(options.cache_pins for options in seen)  # (a pin copies the KV: no default)


def test_the_socket_memory_is_bounded() -> None:
    memory = SocketMemory(max_responses=2, max_bytes=200)
    item = {"role": "user", "content": "x" * 40}
    for n in range(3):
        memory.put(f"r{n}", [item])
    assert memory.get("r0") is None and memory.get("r1") and len(memory) == 2
    memory.put("big", [{"content": "y" * 300}])  # over the byte bound: not kept
    assert memory.get("big") is None
    memory.put("r3", [item, item])
    assert memory.bytes <= 200 and memory.get("r3") == [item, item]


def test_generate_false_prepares_the_state_without_output(app: FakeApp) -> None:
    with socket(app.client) as ws:
        events = run(ws, input="a long system setup " * 8, generate=False, store=False)
        assert [e["type"] for e in events] == [
            "response.created", "response.in_progress", "response.completed"]
        warm = events[-1]["response"]
        assert warm["output"] == [] and warm["status"] == "completed"
        assert warm["usage"]["output_tokens"] == 0
        going = final(ws, input="go", previous_response_id=warm["id"])
    assert going["previous_response_id"] == warm["id"] and going["output"]
    assert going["usage"]["input_tokens_details"]["cached_tokens"] >= (
        0.8 * warm["usage"]["input_tokens"])
    app.check_idle()


def test_processed_gets_no_reply(app: FakeApp) -> None:
    with socket(app.client) as ws:
        ws.send_json({"type": "response.processed", "response_id": "resp_x"})
        assert run(ws, input="hi")[0]["type"] == "response.created"  # the first reply
    app.check_idle()


@pytest.mark.parametrize("frame, status", [
    ("{not json", 400), ("[1, 2]", 400), ('"text"', 400), ('{"no": "type"}', 400),
    ('{"type": "response.fly"}', 400), (b"\x00\x01", 400),
    ('{"type": "response.create", "model": "fake", "input": "x", "stream_id": 3}', 400),
    ('{"type": "response.create", "model": "fake", "input": "x", "generate": "no"}', 400),
    ('{"type": "response.create", "model": "fake", "input": 7}', 400),
    ('{"type": "response.create", "model": "fake", "input": "x", "background": true}', 400),
    ('{"type": "response.create", "model": "fake", "input": "x", '
     '"previous_response_id": "resp_nope"}', 404),
])
def test_a_bad_frame_is_an_error_event_and_the_socket_lives(
        app: FakeApp, frame: str | bytes, status: int) -> None:
    with socket(app.client) as ws:
        if isinstance(frame, bytes):
            ws.send_bytes(frame)
        else:
            ws.send_text(frame)
        error = ws.receive_json()
        assert error["type"] == "error" and error["status"] == status, error
        assert set(error["error"]) >= {"type", "code", "message", "param"}
        assert run(ws, input="hi")[-1]["type"] in FINAL[:2]
    app.check_idle()


def test_an_error_event_carries_the_stream_id(app: FakeApp) -> None:
    with socket(app.client) as ws:
        error = run(ws, input="x", previous_response_id="resp_nope", stream_id="lane-9")[-1]
    assert error["type"] == "error" and error["stream_id"] == "lane-9"


@pytest.mark.parametrize("headers", [{}, auth("nope"), {"x-api-key": "wrong"}])
def test_a_handshake_without_a_valid_key_is_refused(app: FakeApp,
                                                    headers: dict[str, str]) -> None:
    refused = refusal(app.client, **headers)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"


def test_a_foreign_page_is_refused_and_an_allowed_one_accepted(app: FakeApp) -> None:
    refused = refusal(app.client, origin="https://evil.example", **auth())
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "origin_not_allowed"
    for origin in ("http://localhost:5173", "http://localhost"):  # allowed; same origin
        with socket(app.client, origin=origin) as ws:
            assert run(ws, input="hi")[-1]["type"] in FINAL[:2]
    foreign_host = refusal(app.client, "ws://rebound.example/v1/responses", **auth())
    assert foreign_host.status_code == 403
    assert foreign_host.json()["error"]["code"] == "host_not_allowed"
    app.check_idle()


def test_the_unversioned_path_serves_the_same_socket(app: FakeApp) -> None:
    with app.client.websocket_connect("ws://localhost/responses", headers=auth()) as ws:
        assert run(ws, input="hi")[-1]["type"] in FINAL[:2]
    app.check_idle()


def test_a_frame_over_the_body_limit_closes_the_socket() -> None:
    with FakeApp(app_options={"max_body_bytes": 4096}) as small:
        with socket(small.client, key="") as ws:
            ws.send_text(json.dumps({"type": "response.create", **BASE, "input": "x" * 5000}))
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
        assert closed.value.code == 1009
        small.check_idle()


def test_several_models_lease_the_named_one_per_response() -> None:
    specs = [ModelSpec(name=name, path=f"{name}.gguf", memory_mb=1.0) for name in ("one", "two")]
    manager = ModelManager(specs, server_factory=lambda spec: fake_server(
        spec.path, **SERVER_OPTIONS))
    app = create_app(manager, embeddings=False, own_server=True, responses_store=":memory:")
    with TestClient(app, base_url="http://localhost") as client:
        with client.websocket_connect(URL) as ws:
            done = final(ws, input="hi", model="two", max_output_tokens=2)
            assert done["model"] == "two"
            unknown = run(ws, input="hi", model="three")[-1]
            assert unknown["type"] == "error" and unknown["status"] == 404
            again = final(ws, input="more", model="one", previous_response_id=done["id"])
            assert again["model"] == "one"
        assert all(status.in_flight == 0 for status in manager.status())


def test_a_response_wakes_a_sleeping_model_and_a_refused_handshake_does_not() -> None:
    servers: list[Any] = []

    def load() -> Any:
        servers.append(fake_server(**SERVER_OPTIONS))
        return servers[-1]

    app = create_app(load, alias=ALIAS, api_keys=KeyTable.parse(KEYS_FILE), embeddings=False,
                     sleep_idle_seconds=0.05, own_server=True, responses_store=":memory:")
    with TestClient(app, base_url="http://localhost") as client:
        source = app.state.llamapy.source
        deadline = time.monotonic() + START_S
        while not source.sleeping:
            assert time.monotonic() < deadline, "the model did not fall asleep"
            time.sleep(0.01)
        try:
            assert refusal(client, **auth("nope")).status_code == 401
            with socket(client) as ws:
                assert len(servers) == 1 and source.sleeping  # accepting wakes nothing
                assert final(ws, input="wake up")["status"] in ("completed", "incomplete")
            assert len(servers) == 2
        finally:
            for server in servers:
                server.close()


# --- the official client on uvicorn --------------------------------------------------------------


@contextmanager
def live(app: Any, lifespan: str = "auto") -> Iterator[str]:
    """``app`` served by uvicorn (WebSockets on, as the server runs it) on a free port
    (``lifespan="off"``: an app a test client runs already)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, ws="auto", ws_max_size=1 << 20,
                            lifespan=lifespan, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-ws", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(START_S)


def test_the_official_client_connects_and_continues() -> None:
    server = fake_server(**{**SERVER_OPTIONS, "n_ctx": 4096})
    app = create_app(server, alias=ALIAS, embeddings=False, own_server=True, api_key="sk-ws",
                     responses_store=":memory:")
    with live(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-ws", max_retries=0)
        with client.responses.connect() as conn:
            conn.response.create(model=ALIAS, input="hello", store=False,
                                 max_output_tokens=4)
            kinds = []
            for event in conn:
                kinds.append(event.type)
                if event.type in ("response.completed", "response.incomplete", "error"):
                    break
            assert kinds[0] == "response.created" and event.type != "error", kinds
            first = event.response  # type: ignore[union-attr]
            conn.response.create(model=ALIAS, input="more", store=False, max_output_tokens=4,
                                 previous_response_id=first.id)
            for event in conn:
                if event.type in ("response.completed", "response.incomplete", "error"):
                    break
            assert event.type != "error", event
            assert event.response.previous_response_id == first.id  # type: ignore[union-attr]
            conn.response.steer(input="also", previous_response_id=first.id)
            failed = next(iter(conn))
            assert failed.type == "response.steer.failed", failed
            assert failed.error.code == "response_already_completed"  # type: ignore[union-attr]
            assert failed.steer.previous_response_id == first.id  # type: ignore[union-attr]
        wrong = openai.OpenAI(base_url=url + "/v1", api_key="sk-nope", max_retries=0)
        with pytest.raises(InvalidStatus) as refused, wrong.responses.connect():
            pass
        assert refused.value.response.status_code == 401


def test_a_socket_closed_mid_stream_frees_its_slot() -> None:
    # 600 tokens at 50 ms each would take 30 s: idle within the bound only if cancelled (on
    # uvicorn, whose event loop outlives the socket, unlike the in-process test client's)
    with FakeApp(options={"n_ctx": 4096, "sleep_s": 0.05}) as slow, live(
            slow.client.app, lifespan="off") as url:
        with connect(url.replace("http", "ws") + "/v1/responses") as ws:
            ws.send(json.dumps({"type": "response.create", **BASE, "input": "talk",
                                "max_output_tokens": 600, "ignore_eos": True}))
            while json.loads(ws.recv(timeout=START_S))["type"] != "response.output_text.delta":
                pass
            assert slow.server.stats()["slots_active"] == 1
        slow.check_idle(bound_s=10.0)


def test_a_flood_of_creates_is_bounded_and_the_socket_lives(app: FakeApp) -> None:
    """Frames sent faster than responses run wait up to ``MAX_PENDING``; each one past that
    is answered with a 429 error event at once, and every accepted one still completes."""
    sent = responses_ws.MAX_PENDING * 3
    with socket(app.client) as ws:
        for i in range(sent):
            ws.send_json({"type": "response.create", **BASE, "input": f"flood {i}",
                          "max_output_tokens": 16, "store": False})
        done = refused = 0
        while done + refused < sent:
            event = ws.receive_json()
            if event["type"] == "error":
                assert event["status"] == 429, event
                refused += 1
            elif event["type"] in FINAL[:2]:
                done += 1
        assert refused > 0 and done >= responses_ws.MAX_PENDING  # every frame answered once
        assert final(ws, input="after the flood")["status"] in ("completed", "incomplete")
    app.check_idle()


def test_a_deeply_nested_item_is_refused_if_stored_and_runs_if_not(app: FakeApp) -> None:
    deep = "[" * 1000 + "]" * 1000
    frame = ('{"type": "response.create", "model": "fake", "max_output_tokens": 2, '
             '"store": %s, "input": [{"role": "user", "content": "x", "junk": %s}]}')
    with socket(app.client) as ws:
        ws.send_text(frame % ("true", deep))
        refused = ws.receive_json()
        assert refused["type"] == "error" and refused["status"] == 400, refused
        ws.send_text(frame % ("false", deep))
        assert until_final(ws)[-1]["type"] in FINAL[:2]
        assert final(ws, input="still here")["status"] in ("completed", "incomplete")
    app.check_idle()
