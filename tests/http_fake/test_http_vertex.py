"""Vertex AI's ``/predict`` (``AIP_MODE=PREDICTION``) on the fake backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_http import ALIAS, CHAT, FakeApp

from llamapy.errors import InvalidOptionError
from llamapy.serve.routes.vertex import (
    MAX_INSTANCES,
    VertexSettings,
    install_vertex,
    request_format,
    vertex_settings,
)


@pytest.fixture(scope="module")
def vertex() -> Iterator[FakeApp]:
    with FakeApp() as served:
        install_vertex(served.client.app, VertexSettings(health_path="/ping"))  # type: ignore[arg-type]
        yield served


def test_request_format_names() -> None:
    assert request_format("/v1/chat/completions") == "chatCompletions"
    assert request_format("/apply-template") == "applyTemplate"
    assert request_format("/completion") == "completion"


def test_settings_from_the_environment() -> None:
    assert vertex_settings({}) is None
    got = vertex_settings({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "8081",
                           "AIP_PREDICT_ROUTE": "/v1/endpoints/x:predict"})
    assert got == VertexSettings("/v1/endpoints/x:predict", None, 8081)
    for bad in ({"AIP_HTTP_PORT": "0"}, {"AIP_HTTP_PORT": "x"}, {"AIP_PREDICT_ROUTE": "p"}):
        with pytest.raises(InvalidOptionError):
            vertex_settings({"AIP_MODE": "PREDICTION", **bad})


def test_instances_are_answered_in_order_as_their_routes_answer(vertex: FakeApp) -> None:
    chat = {**CHAT, "model": ALIAS, "temperature": 0}
    direct = vertex.send("POST", "/v1/chat/completions", json=chat).json()
    r = vertex.send("POST", "/predict", json={"instances": [
        {"@requestFormat": "chatCompletions", **chat, "stream": True},
        {"@requestFormat": "/tokenize", "content": "hi"},
        {"@requestFormat": "nothing"}, "x", {"@requestFormat": "chatCompletions"}]})
    assert r.status_code == 200, r.text
    first, tokens, unknown, not_object, bad_chat = r.json()["predictions"]
    assert first["choices"][0]["message"] == direct["choices"][0]["message"]
    assert tokens["tokens"]
    assert "no handler" in unknown["error"]["message"]
    assert not_object["error"]["code"] == 400
    assert "error" in bad_chat
    assert vertex.send("GET", "/ping").status_code == 200
    vertex.check_idle()


TOO_MANY = b'{"instances": [%s]}' % b",".join([b"{}"] * (MAX_INSTANCES + 1))


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"instances": {}}', TOO_MANY])
def test_bad_bodies_are_400s(vertex: FakeApp, body: bytes) -> None:
    r = vertex.send("POST", "/predict", content=body,
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
