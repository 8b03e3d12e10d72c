"""What a key may do to a shared model's life, on the fake backend: only a valid key wakes a
sleeping model (a request without one is a 401 that wakes nothing), a tenant key's
``keep_alive`` neither unloads nor re-times a shared model (its request still succeeds),
``/metrics?model=`` checks the key and the admin's right before it loads anything, and the key
is checked before a model route's body is read."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from fake_http import SERVER_OPTIONS
from starlette.applications import Starlette
from starlette.testclient import TestClient

from llamapy.serve import create_app
from llamapy.serve.tenants import KeyTable
from llamapy.server import ModelManager, ModelSpec, ModelState, Server
from llamapy.server.fake import fake_server

KEYS = "ka acme\nkb beta\nkadm ops admin\nkdef\n"
#: Bound on waiting for the model manager's background work (a bound, not a speed figure).
WAIT_S = 30.0
GENERATE = {"model": "two", "prompt": "hi", "stream": False, "options": {"num_predict": 2}}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# --- several models ----------------------------------------------------------------------------


@pytest.fixture
def models() -> Iterator[tuple[TestClient, ModelManager]]:
    specs = [ModelSpec(name=name, path=f"{name}.gguf", memory_mb=1.0) for name in ("one", "two")]
    manager = ModelManager(specs, server_factory=lambda spec: fake_server(
        spec.path, **SERVER_OPTIONS))
    app = create_app(manager, api_keys=KeyTable.parse(KEYS), embeddings=False, own_server=True)
    with TestClient(app, base_url="http://localhost") as client:
        yield client, manager


def state(manager: ModelManager, name: str = "two") -> ModelState:
    return manager.status_of(name).state


@pytest.mark.parametrize("key", ["ka", "kdef"])
def test_a_tenant_keep_alive_zero_leaves_a_shared_model_loaded(
        models: tuple[TestClient, ModelManager], key: str) -> None:
    client, manager = models
    assert client.post("/models/load", json={"model": "two"},
                       headers=auth("kadm")).status_code == 200
    kept = manager.status_of("two").keep_alive
    for body in ({"model": "two", "keep_alive": 0},  # load only: Ollama's "unload"
                 {**GENERATE, "keep_alive": 0}, {**GENERATE, "keep_alive": "10000h"}):
        r = client.post("/api/generate", json=body, headers=auth(key))
        assert r.status_code == 200, r.text
        assert r.json()["done_reason"] != "unload"
        assert state(manager) is ModelState.LOADED
        assert manager.status_of("two").keep_alive == kept  # the admin's, untouched
    r = client.post("/api/chat", json={"model": "two", "messages": [], "keep_alive": 0},
                    headers=auth(key))
    assert r.status_code == 200 and r.json()["done_reason"] == "load"
    assert manager.status_of("two").keep_alive == kept


def test_an_admin_keep_alive_zero_unloads(models: tuple[TestClient, ModelManager]) -> None:
    client, manager = models
    r = client.post("/api/generate", json={"model": "two", "keep_alive": 0},
                    headers=auth("kadm"))
    assert r.status_code == 200 and r.json()["done_reason"] == "unload"
    wait_for(lambda: state(manager) is ModelState.UNLOADED, "the admin's unload")


def test_metrics_of_a_model_check_the_key_before_loading(
        models: tuple[TestClient, ModelManager]) -> None:
    client, manager = models
    for headers, status in (({}, 401), (auth("nope"), 401), (auth("ka"), 403),
                            (auth("kdef"), 403)):
        r = client.get("/metrics?model=two", headers=headers)
        assert r.status_code == status, r.text
        assert state(manager) is ModelState.UNLOADED
    r = client.get("/metrics?model=two", headers=auth("kadm"))
    assert r.status_code == 200 and state(manager) is ModelState.LOADED


def test_no_key_is_a_401_before_the_body_is_read(models: tuple[TestClient, ModelManager]
                                                 ) -> None:
    client, manager = models
    app: Starlette = client.app  # type: ignore[assignment]
    reads: list[object] = []

    async def receive() -> dict[str, Any]:
        reads.append(object())
        raise AssertionError("the body of a request without a key was read")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
             "scheme": "http", "server": ("localhost", 80), "client": ("127.0.0.1", 1),
             "http_version": "1.1",
             "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"),
                         (b"content-length", b"4096")]}
    anyio.run(app, scope, receive, send)
    assert sent[0]["status"] == 401 and reads == []
    assert state(manager, "one") is ModelState.UNLOADED


# --- one sleeping model ------------------------------------------------------------------------


@pytest.fixture
def sleepy() -> Iterator[tuple[TestClient, list[Server]]]:
    """An app whose model sleeps after a short idle spell, and every Server its loader made."""
    servers: list[Server] = []

    def load() -> Server:
        servers.append(fake_server(**SERVER_OPTIONS))
        return servers[-1]

    app = create_app(load, alias="fake", api_keys=KeyTable.parse(KEYS), embeddings=False,
                     sleep_idle_seconds=0.05, own_server=True)
    with TestClient(app, base_url="http://localhost") as client:
        ctx = app.state.llamapy
        wait_for(lambda: ctx.source.sleeping, "the model falling asleep")
        try:
            yield client, servers
        finally:
            for server in servers:
                server.close()


@pytest.mark.parametrize(("path", "body", "shape"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "error"),
    ("/v1/messages", {"model": "fake", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]}, "type"),
    ("/api/generate", {"model": "fake", "prompt": "hi"}, "error"),
    ("/completion", {"prompt": "hi", "n_predict": 2}, "error"),
])
def test_a_request_without_a_key_never_wakes_a_sleeping_model(
        sleepy: tuple[TestClient, list[Server]], path: str, body: dict[str, Any],
        shape: str) -> None:
    client, servers = sleepy
    for headers in ({}, auth("nope"), {"x-api-key": "nope"}):
        r = client.post(path, json=body, headers=headers)
        assert r.status_code == 401 and shape in r.json(), r.text
    assert len(servers) == 1 and client.app.state.llamapy.source.sleeping  # type: ignore
    woken = client.post(path, json=body, headers=auth("ka"))
    assert woken.status_code == 200, woken.text
    assert len(servers) == 2
