"""Embeddings requests are held to the engine's request bounds (:mod:`llamapy.serve.embed_bounds`),
on the fake backend: a tenant at ``tenant_max_requests`` and a model at ``max_queue`` get a 429
on every embeddings route, other tenants are still served.

The fake model has no embeddings context: the embedder's decode (``Embedder._embed_groups``, on
its worker thread) is replaced by :class:`HeldDecode`, which holds each request there until the
test lets it go, and answers zero vectors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fake_http import ALIAS, SERVER_OPTIONS
from starlette.testclient import TestClient

from llamapy.embeddings import Embedder
from llamapy.serve import create_app
from llamapy.serve.tenants import KeyTable
from llamapy.server import ModelManager, ModelSpec
from llamapy.server.fake import fake_server

#: A bound on every wait of these tests (a liveness guard, not a speed figure).
BOUND_S = 30.0
KEYS = "ka acme\nkb beta\n"
#: Every embeddings route: (path, body).
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/embeddings", {"input": "hello"}),
    ("/embeddings", {"content": "hello"}),
    ("/api/embed", {"model": ALIAS, "input": "hello"}),
    ("/api/embeddings", {"model": ALIAS, "prompt": "hello"}),
]


class HeldDecode:
    """Stands in for the embedder's decode: counts the requests that reached it and holds them
    until :meth:`release`."""

    def __init__(self) -> None:
        self.reached = threading.Semaphore(0)
        self.released = threading.Event()

    def __call__(self, embedder: Embedder, inputs: Any, groups: Any, cancel: Any) -> Any:
        self.reached.release()
        self.released.wait(BOUND_S)
        return np.zeros((len(inputs), embedder.n_embd), dtype=np.float32)

    def wait_reached(self, n: int = 1) -> None:
        for _ in range(n):
            assert self.reached.acquire(timeout=BOUND_S), "no request reached the decode"

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldDecode]:
    decode = HeldDecode()
    monkeypatch.setattr(Embedder, "_embed_groups",
                        lambda self, inputs, groups, cancel: decode(self, inputs, groups, cancel))
    yield decode
    decode.release()


def wait_for(condition: Callable[[], bool]) -> None:
    """Wait (at most :data:`BOUND_S`) until ``condition()``."""
    deadline = time.monotonic() + BOUND_S
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.002)


class Pending:
    """A request sent on a thread of its own (it may be held at the decode)."""

    def __init__(self, client: TestClient, path: str, body: dict[str, Any],
                 key: str | None = None) -> None:
        self.response: httpx.Response | None = None
        headers = {"Authorization": f"Bearer {key}"} if key else {}

        def send() -> None:
            self.response = client.post(path, json=body, headers=headers)

        self.thread = threading.Thread(target=send, daemon=True)
        self.thread.start()

    def answer(self, held: HeldDecode) -> httpx.Response:
        """The answer; if it is held at the decode, after the decode is let go."""
        self.thread.join(BOUND_S)
        if self.thread.is_alive():
            held.release()
            self.thread.join(BOUND_S)
        assert self.response is not None, "no answer"
        return self.response


def test_a_tenant_at_its_bound_gets_a_429_on_every_embeddings_route(held: HeldDecode) -> None:
    server = fake_server(**{**SERVER_OPTIONS, "tenant_max_requests": 1})
    app = create_app(server, alias=ALIAS, api_keys=KeyTable.parse(KEYS), own_server=True)
    with TestClient(app, base_url="http://localhost") as client:
        first = Pending(client, "/v1/embeddings", {"input": "hold"}, "ka")
        held.wait_reached()
        for path, body in ROUTES:
            r = Pending(client, path, body, "ka").answer(held)
            assert r.status_code == 429, (path, r.text)
            assert "tenant" in r.text and r.headers.get("Retry-After"), path
        other = Pending(client, "/api/embed", {"model": ALIAS, "input": "b"}, "kb")
        in_flight = app.state.llamapy.embedding_requests
        wait_for(lambda: (ALIAS, "beta") in in_flight.counts()[1])  # beta is admitted
        held.release()
        assert first.answer(held).status_code == 200
        assert other.answer(held).status_code == 200
        assert in_flight.counts() == ({}, {})
        for path, body in ROUTES:  # the bound held requests in flight only
            assert client.post(path, json=body, headers={"Authorization": "Bearer ka"}
                               ).status_code == 200, path


def test_the_queue_bound_holds_where_each_request_has_an_embedder(held: HeldDecode) -> None:
    specs = [ModelSpec(name=name, path=f"{name}.gguf", memory_mb=1.0) for name in ("one", "two")]
    manager = ModelManager(specs, server_factory=lambda spec: fake_server(
        spec.path, **{**SERVER_OPTIONS, "max_queue": 1}))
    app = create_app(manager, own_server=True)
    with TestClient(app, base_url="http://localhost") as client:
        body = {"model": "one", "input": "hello"}
        running = [Pending(client, "/v1/embeddings", body) for _ in range(2)]
        held.wait_reached(2)  # one running and max_queue 1 waiting: both in flight
        r = Pending(client, "/v1/embeddings", body).answer(held)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["type"] == "rate_limit_error"
        held.release()
        assert [p.answer(held).status_code for p in running] == [200, 200]
        assert client.post("/v1/embeddings", json=body).status_code == 200
