"""What the Responses WebSocket tests share: the socket's URL, a request's base fields, and
sending, reading and refusing on a Starlette ``TestClient`` socket."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fake_http import ALIAS, FakeApp
from starlette.testclient import TestClient, WebSocketDenialResponse

#: The socket's URL (the host guard answers ``localhost``, not the test client's default name).
URL = "ws://localhost/v1/responses"
BASE = {"model": ALIAS, "max_output_tokens": 4, "temperature": 0}
FINAL = ("response.completed", "response.incomplete", "error")
#: Bound on uvicorn's start (a bound, not a speed figure).
START_S = 30.0


def auth(key: str = "ka") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def socket(client: TestClient, key: str = "ka", **headers: str) -> Iterator[Any]:
    with client.websocket_connect(URL, headers={**auth(key), **headers}) as ws:
        yield ws


def refusal(client: TestClient, url: str = URL, **headers: str) -> WebSocketDenialResponse:
    """The denial response of a handshake that must be refused."""
    try:
        with client.websocket_connect(url, headers=headers):
            pass
    except WebSocketDenialResponse as denial:
        return denial
    raise AssertionError("the handshake was accepted")


def until_final(ws: Any) -> list[dict[str, Any]]:
    """The events up to a response's last (or an error)."""
    events = [ws.receive_json()]
    while events[-1]["type"] not in FINAL:
        events.append(ws.receive_json())
    return events


def run(ws: Any, **body: Any) -> list[dict[str, Any]]:
    ws.send_json({"type": "response.create", **BASE, **body})
    return until_final(ws)


def final(ws: Any, **body: Any) -> dict[str, Any]:
    events = run(ws, **body)
    assert events[-1]["type"] in FINAL[:2], events[-1]
    return dict(events[-1]["response"])


def post(app: FakeApp, **body: Any) -> dict[str, Any]:
    r = app.send("POST", "/v1/responses", json={**BASE, **body}, headers=auth())
    assert r.status_code == 200, r.text
    return dict(r.json())
