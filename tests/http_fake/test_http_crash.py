"""A server whose tick thread died (a bug) says so: ``/health`` answers 503 naming the crash,
and every request is refused at once with that error, never left to wait for its timeout."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from llamapy.engine import FakeBackend
from llamapy.engine.fake.text import FakeTextModel
from llamapy.engine.testing import CrashingEngine
from llamapy.runtime import Hosted, LoopState
from llamapy.serve import create_app
from llamapy.server import Server
from llamapy.server.options import ResolvedStart

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}



def test_a_crashed_server_says_so_on_health_and_refuses_every_request() -> None:
    engines: list[CrashingEngine] = []

    def build(start: ResolvedStart) -> Hosted:
        model = FakeTextModel()
        backend = FakeBackend(n_ctx=start.server.n_ctx, n_seq_max=start.server.n_parallel,
                              model=model.fake)
        engines.append(CrashingEngine(backend, start.engine))
        return Hosted(engine=engines[0], model=model)

    server = Server.hosting(build, "fake.gguf", n_ctx=1024, n_parallel=2)
    app = create_app(server, alias="fake", embeddings=False, own_server=True)
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as client:
        server.wait_ready(10)
        assert client.get("/health").status_code == 200
        engines[0].armed = True
        first = client.post("/v1/chat/completions", json=CHAT)
        assert first.status_code == 503, first.text
        assert server.runtime.state is LoopState.CRASHED
        health = client.get("/health")
        assert health.status_code == 503 and "thread died" in _message(health.json())
        later = client.post("/v1/chat/completions", json=CHAT)
        assert later.status_code == 503 and "thread died" in _message(later.json())


def _message(body: dict[str, Any]) -> str:
    return str(body["error"]["message"])
