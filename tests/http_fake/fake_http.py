"""The whole HTTP app in-process on the fake backend, and the checks a test runs on it.

:class:`FakeApp` serves ``create_app(fake_server(...))`` through Starlette's ``TestClient``
(no socket, no libllama; a request takes milliseconds). :meth:`FakeApp.send` bounds a request's
wall time and notices at once when the tick thread dies; :meth:`FakeApp.check_idle` waits for
the engine to go idle and runs its integrity checks on the tick thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.testclient import TestClient

from llamapy.engine import Engine
from llamapy.serve import create_app
from llamapy.serve.pages.live_view import events_router
from llamapy.server import Server
from llamapy.server.fake import fake_server

ALIAS = "fake"
#: Start options of the test server: small, so a request that fills its context stays cheap.
SERVER_OPTIONS: dict[str, Any] = {"n_ctx": 1024, "n_parallel": 2, "n_batch": 256,
                                  "chunk_size": 64, "max_queue": 8, "seed": 7}
#: Seconds a request may take before the app answers it with a timeout (504).
REQUEST_TIMEOUT = 10.0
#: Wall-clock bound on one request, answer included (a bound, not a speed figure).
SEND_BOUND_S = 3 * REQUEST_TIMEOUT
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class TickThreadDied(AssertionError):
    """The server's tick thread ended while serving a request."""


@dataclass
class FakeApp:
    """A fake server, its app and a ``TestClient`` on it (use as a context manager)."""

    slot_folder: Path | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    #: More ``create_app`` keywords (``api_keys``, ``cache_report``, ...).
    app_options: Mapping[str, Any] = field(default_factory=dict)
    server: Server = field(init=False)
    client: TestClient = field(init=False)

    def __post_init__(self) -> None:
        self.server = fake_server(**{**SERVER_OPTIONS, **self.options})
        app = create_app(self.server, alias=ALIAS, embeddings=False, props=True,
                         slot_save_path=None if self.slot_folder is None
                         else str(self.slot_folder),
                         request_timeout=REQUEST_TIMEOUT, own_server=True,
                         **{"responses_store": ":memory:", **self.app_options})
        self.client = TestClient(app, base_url="http://localhost",
                                 raise_server_exceptions=False)
        self.client.__enter__()
        self.server.wait_ready(10)
        # the app's host takes the server on a thread of its own: wait for it too, or the
        # first request may find the model "loading"
        app.state.llamapy.source.wait_started(10)

    def __enter__(self) -> FakeApp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        """Whether the tick thread still runs."""
        return self.server.runtime.alive

    def close(self) -> None:
        """Close the app (and its server). A dead server's app closes on a thread of its own:
        requests stuck on it hold the client until their timeout."""
        if self.alive:
            self.client.__exit__(None, None, None)
            return
        threading.Thread(target=self.client.__exit__, args=(None, None, None),
                         name="fake-http-close", daemon=True).start()

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request, answered within :data:`SEND_BOUND_S`; raises :class:`TickThreadDied`
        as soon as the tick thread is gone."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["response"] = self.client.request(method, path, **kwargs)
            except BaseException as exc:  # re-raised on the test's thread
                box["error"] = exc

        thread = threading.Thread(target=run, name="fake-http-request", daemon=True)
        thread.start()
        deadline = time.monotonic() + SEND_BOUND_S
        while thread.is_alive():
            thread.join(0.005)
            if not self.alive:
                raise TickThreadDied(f"the tick thread died serving {method} {path}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{method} {path} got no answer in {SEND_BOUND_S} s")
        if "error" in box:
            raise box["error"]
        return box["response"]

    def check_idle(self, bound_s: float = 10.0) -> None:
        """Wait (up to ``bound_s``) until no request runs or waits, then check every engine
        and fake-backend invariant on the tick thread: no slot, queue entry, lease, sampler
        or KV cell left behind."""
        deadline = time.monotonic() + bound_s
        while True:
            if not self.alive:
                raise TickThreadDied("the tick thread died")
            stats = self.server.stats()
            if stats["slots_active"] == 0 and stats["queue_depth"] == 0:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"still busy after {bound_s} s: {stats['slots']}")
            time.sleep(0.002)
        self.server.call(check_engine_idle, timeout=bound_s)


def check_engine_idle(engine: Engine) -> None:
    """The engine's and its backend's invariants, with nothing in flight (tick thread)."""
    engine.check_integrity()
    backend: Any = engine.backend
    backend.check_integrity()
    assert not engine.runs, f"runs left: {list(engine.runs)}"
    assert not engine.queue, "queued runs left"
    assert not engine.pool.leases, f"leases left: {engine.pool.leases}"
    assert not backend.open_samplers, f"{len(backend.open_samplers)} samplers left open"


@contextmanager
def fake_app(**kwargs: Any) -> Iterator[FakeApp]:
    """A :class:`FakeApp`, closed after use."""
    app = FakeApp(**kwargs)
    try:
        yield app
    finally:
        app.close()


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """``(event name or None, data)`` of each event of an SSE body (comments skipped)."""
    out = []
    for block in text.split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            out.append((name, "\n".join(data)))
    return out


def feed_frame(app: FakeApp, key: str) -> dict[str, Any]:
    """The first frame of ``/v1/llamapy/events`` for ``key`` (through the route's endpoint:
    the in-process client cannot hang up on an endless feed)."""
    ctx = app.client.app.state.llamapy  # type: ignore[attr-defined]
    endpoint: Callable[[Request], Any] = events_router(ctx).routes[0].endpoint  # type: ignore

    async def first() -> dict[str, Any]:
        async def receive() -> dict[str, Any]:
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        scope = {"type": "http", "method": "GET", "path": "/v1/llamapy/events",
                 "query_string": b"", "headers": [(b"authorization", f"Bearer {key}".encode())]}
        response = await endpoint(Request(scope, receive))
        try:
            chunk = await response.body_iterator.__anext__()
        finally:
            await response.body_iterator.aclose()
            await response._source.aclose()
        return dict(json.loads(sse_events(chunk.decode())[0][1]))

    return anyio.run(first)


@contextmanager
def submitted_options(app: FakeApp) -> Iterator[list[Any]]:
    """The options of every request the engine is given inside the block (recorded on the
    tick thread, in submission order)."""
    seen: list[Any] = []

    def install(engine: Engine) -> None:
        submit = engine.submit

        def recording(request: Any) -> None:
            seen.append(request.options)
            submit(request)

        engine.submit = recording  # type: ignore[method-assign]

    app.server.call(install)
    try:
        yield seen
    finally:
        app.server.call(lambda engine: vars(engine).pop("submit", None))


def keyed_app(keys_file: str, **options: Any) -> FakeApp:
    """A fake app behind the API keys (and tenants) of ``keys_file``, keeping stored responses
    in memory, its context long enough for many-turn conversations (``options``: more of the
    fake server's)."""
    from llamapy.serve.tenants import KeyTable

    return FakeApp(options={"n_ctx": 8192, **options}, app_options={
        "api_keys": KeyTable.parse(keys_file), "responses_store": ":memory:"})
