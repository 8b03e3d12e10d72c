"""Ollama's ``keep_alive: 0`` with one model served: a model the app can reload (a loader, as
``python -m llamapy.serve`` gives it) sleeps once the request that asked ends and wakes for the
next, which keeps it loaded again; a tenant key's ``keep_alive`` changes nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_http import SERVER_OPTIONS
from starlette.testclient import TestClient

from llamapy.serve import create_app
from llamapy.serve.tenants import KeyTable
from llamapy.server import Server
from llamapy.server.fake import fake_server

WAIT_S = 10.0
GENERATE = {"model": "fake", "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
KEYS = "kadm - admin\nkten acme\n"


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"no {what} in {WAIT_S} s"
        time.sleep(0.01)


@pytest.fixture
def reloadable() -> Iterator[tuple[TestClient, Any, list[Server]]]:
    """An app on a loader (no idle sleep), its model source and every Server it made."""
    servers: list[Server] = []

    def load() -> Server:
        servers.append(fake_server(**SERVER_OPTIONS))
        return servers[-1]

    app = create_app(load, alias="fake", api_keys=KeyTable.parse(KEYS), embeddings=False,
                     own_server=True)
    with TestClient(app, base_url="http://localhost") as client:
        source = app.state.llamapy.source
        source.wait_started(WAIT_S)
        yield client, source, servers


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keep_alive_0_unloads_after_the_request_and_the_next_one_wakes_it(
        reloadable: tuple[TestClient, Any, list[Server]]) -> None:
    client, source, servers = reloadable
    answer = client.post("/api/generate", json={**GENERATE, "keep_alive": 0},
                         headers=auth("kadm"))
    assert answer.status_code == 200 and answer.json()["eval_count"] == 2
    wait_for(lambda: source.sleeping, "sleep after keep_alive 0")
    wait_for(lambda: not servers[0].runtime.alive, "the first server closed")
    assert client.post("/api/generate", json=GENERATE, headers=auth("kadm")).json()["done"]
    assert len(servers) == 2 and not source.sleeping
    time.sleep(0.2)  # the woken model keeps the app's own bound (loaded), not the 0
    assert not source.sleeping and servers[1].runtime.alive


def test_a_load_only_keep_alive_0_unloads_at_once(
        reloadable: tuple[TestClient, Any, list[Server]]) -> None:
    client, source, _ = reloadable
    unload = client.post("/api/generate", json={"model": "fake", "keep_alive": 0},
                         headers=auth("kadm")).json()
    assert unload["done_reason"] == "unload"
    wait_for(lambda: source.sleeping, "sleep after an unload request")


def test_a_tenant_keys_keep_alive_0_leaves_the_model_loaded(
        reloadable: tuple[TestClient, Any, list[Server]]) -> None:
    client, source, servers = reloadable
    for body in ({"model": "fake", "keep_alive": 0}, {**GENERATE, "keep_alive": 0}):
        assert client.post("/api/generate", json=body, headers=auth("kten")).status_code == 200
    time.sleep(0.2)
    assert not source.sleeping and len(servers) == 1 and servers[0].runtime.alive
