"""``--pull-on-demand``: a request naming a Hub model not served yet pulls it into the store and
leases it; without the option, or for a name that does not spell the Hub out (a bare
``ORG/REPO`` included), it stays a 404; a failed pull adds nothing. Run on the model router with
stand-in servers (no model loads). Who may pull and the pull limits: ``test_hub_pull_policy``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hub_standin import TINY, HubStandin

from llamapy.errors import HubModelNotFoundError, UnknownModelError
from llamapy.hub.fetch import HubAccess
from llamapy.hub.on_demand import OnDemandPuller
from llamapy.hub.store import ModelStore
from llamapy.serve.__main__ import main
from llamapy.serve.multi import ModelRouter
from llamapy.serve.tenants import OPEN
from llamapy.server import ModelManager, ModelSpec


class _Server:
    def __init__(self, spec: ModelSpec) -> None:
        self.path = spec.path

    def wait_ready(self, timeout: float | None = None) -> _Server:
        return self

    def close(self, timeout: float | None = 30.0) -> None:
        pass


def _router(tmp_path: Path, pull: bool) -> tuple[ModelRouter, ModelManager, ModelStore]:
    manager = ModelManager([], server_factory=_Server)
    store = ModelStore(tmp_path / "store")
    puller = OnDemandPuller(manager, store, HubAccess.from_env(), {"n_ctx": 512})
    return ModelRouter(manager, puller=puller if pull else None), manager, store


def _lease(router: ModelRouter, name: str) -> Any:
    async def go() -> Any:
        lease = await router.lease(name, OPEN)
        lease.release()
        return lease

    return asyncio.run(go())


def test_a_requested_hub_model_is_pulled_and_served(hub: HubStandin, tmp_path: Path) -> None:
    router, manager, store = _router(tmp_path, pull=True)
    with manager:
        lease = _lease(router, f"hf.co/{TINY}:q8_0")
        assert lease.name == f"hf.co/{TINY}:Q8_0" and manager.names == [lease.name]
        assert lease.server.path == store.find(lease.name).path
        assert manager.spec(lease.name).options["n_ctx"] == 512
        gets = len(hub.requests)
        assert _lease(router, f"HF.co/{TINY}:Q8_0").name == lease.name  # served: no pull
        assert len(hub.requests) == gets


def test_without_the_option_or_a_hub_name_it_stays_unknown(hub: HubStandin,
                                                          tmp_path: Path) -> None:
    router, manager, _ = _router(tmp_path, pull=False)
    with manager, pytest.raises(UnknownModelError):
        _lease(router, f"hf.co/{TINY}:Q8_0")
    router, manager, store = _router(tmp_path, pull=True)
    with manager:
        for name in ("not a hub name", f"{TINY}:Q8_0", TINY):  # a bare ORG/REPO pulls nothing
            with pytest.raises(UnknownModelError):
                _lease(router, name)
        assert hub.requests == []
        with pytest.raises(HubModelNotFoundError):
            _lease(router, f"hf.co/{TINY}:Q2_K")
        assert manager.names == [] and store.entries() == []
    assert hub.file_requests("tiny-Q8_0.gguf") == []


@pytest.mark.parametrize("argv", [["--pull-on-demand"],
                                  ["--pull-on-demand", "--offline", "--models-dir", "."]])
def test_pull_on_demand_flags_are_checked(argv: list[str], hub_env: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "pull" in capsys.readouterr().err


def _pull_app(tmp_path: Path, pull: bool) -> tuple[Any, ModelManager, ModelStore]:
    from llamapy.serve.app import create_app

    manager = ModelManager([], server_factory=_Server)
    store = ModelStore(tmp_path / "store")
    puller = OnDemandPuller(manager, store, HubAccess.from_env(), {"n_ctx": 512})
    app = create_app(manager, **({"puller": puller} if pull else {}))
    return app, manager, store


def test_ollamas_pull_pulls_a_hub_model_with_pull_on_demand(hub: HubStandin,
                                                            tmp_path: Path) -> None:
    """POST /api/pull pulls into the store and serves the model (Ollama's answer: one
    ``success`` object, or an NDJSON line of it while ``stream``); a failed pull is an error
    in Ollama's shape and adds nothing; a second pull of a served model pulls nothing."""
    from starlette.testclient import TestClient

    app, manager, store = _pull_app(tmp_path, pull=True)
    with manager, TestClient(app, base_url="http://localhost") as client:
        r = client.post("/api/pull", json={"model": f"hf.co/{TINY}:Q8_0", "insecure": False,
                                           "stream": False})  # what ollama.pull() sends
        assert r.status_code == 200 and r.json() == {"status": "success"}
        assert manager.names == [f"hf.co/{TINY}:Q8_0"] and store.find(manager.names[0])
        gets = len(hub.requests)
        streamed = client.post("/api/pull", json={"model": f"hf.co/{TINY}:Q8_0"})
        assert streamed.status_code == 200 and streamed.text == '{"status":"success"}\n'
        assert len(hub.requests) == gets  # served now: nothing pulled
        missing = client.post("/api/pull", json={"model": f"hf.co/{TINY}:Q2_K"})
        assert missing.status_code == 404 and "error" in missing.json()
        assert client.post("/api/pull", json={"model": "not a hub name"}).status_code == 404
        assert manager.names == [f"hf.co/{TINY}:Q8_0"]


def test_ollamas_pull_without_pull_on_demand_is_a_typed_refusal(hub: HubStandin,
                                                                tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    app, manager, store = _pull_app(tmp_path, pull=False)
    with manager, TestClient(app, base_url="http://localhost") as client:
        r = client.post("/api/pull", json={"model": f"hf.co/{TINY}:Q8_0", "stream": False})
        assert r.status_code == 400 and "pull-on-demand" in r.json()["error"]
    assert manager.names == [] and store.entries() == [] and hub.file_requests(
        "tiny-Q8_0.gguf") == []
