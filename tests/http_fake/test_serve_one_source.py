"""The HTTP layer asks one :class:`~llamapy.serve.source.ModelSource` for its models: no route,
page or middleware asks whether it runs on one model or several (a scan of ``llamapy/serve``),
and both sources answer the same questions (one model on a fake server, several on a manager
of fake servers)."""

from __future__ import annotations

import ast
from pathlib import Path

from fake_http import ALIAS, FakeApp
from starlette.testclient import TestClient

import llamapy.serve
from llamapy.serve import create_app
from llamapy.server import ModelManager, ModelSpec
from llamapy.server.fake import fake_server

SERVE = Path(llamapy.serve.__file__).parent
#: The one place that may tell the sources apart: the app's assembly adds router mode's
#: ``/models/load|unload`` routes for several models.
ALLOWED = {("app.py", "ModelRouter")}
SOURCE_TYPES = ("ModelHost", "ModelRouter")


def which_source_checks(path: Path) -> list[tuple[str, str]]:
    """``(file, what)`` for each place ``path`` asks which source it runs on: an
    ``isinstance`` naming a source type, or ``.host`` / ``.models`` read off a context."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            found += [(path.name, name) for name in names & set(SOURCE_TYPES)]
        elif (isinstance(node, ast.Attribute) and node.attr in ("host", "models")
              and getattr(node.value, "id", "") == "ctx"):
            found.append((path.name, f"ctx.{node.attr}"))
    return found


def test_no_route_asks_which_source_it_runs_on() -> None:
    files = sorted(SERVE.rglob("*.py"))
    assert len(files) > 20
    found = {hit for f in files for hit in which_source_checks(f)}
    assert found == ALLOWED


def test_the_scan_catches_a_branch_on_the_source(tmp_path: Path) -> None:
    sample = tmp_path / "route.py"
    sample.write_text("def f(ctx):\n    if ctx.models is None:\n        pass\n"
                      "    return isinstance(ctx.source, ModelHost)\n")
    assert set(which_source_checks(sample)) == {("route.py", "ctx.models"),
                                                ("route.py", "ModelHost")}


def _several() -> ModelManager:
    specs = [ModelSpec(name=name, path=f"{name}.gguf") for name in ("one", "two")]
    return ModelManager(specs, server_factory=lambda spec: fake_server(
        spec.path, n_ctx=256, n_parallel=1).wait_ready(10))


def test_both_sources_answer_the_listings(app: FakeApp) -> None:
    one = {path: app.send("GET", path).json() for path in ("/v1/models", "/api/tags",
                                                           "/api/ps", "/health")}
    assert [m["id"] for m in one["/v1/models"]["data"]] == [ALIAS]
    assert len(one["/api/tags"]["models"]) == len(one["/api/ps"]["models"]) == 1
    assert one["/health"] == {"status": "ok"}
    with TestClient(create_app(_several(), own_server=True, embeddings=False),
                    base_url="http://localhost") as client:
        models = client.get("/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["one", "two"]
        assert {m["status"]["value"] for m in models} == {"unloaded"}
        assert len(client.get("/api/tags").json()["models"]) == 2
        assert client.get("/api/ps").json()["models"] == []  # nothing loaded yet
        done = client.post("/v1/completions", json={"model": "two", "prompt": "a",
                                                    "max_tokens": 2})
        assert done.status_code == 200, done.text
        assert [m["name"] for m in client.get("/api/ps").json()["models"]] == ["two"]
        assert client.get("/v1/models/two").json()["status"]["value"] == "loaded"
        assert client.get("/health").json() == {"status": "ok"}
    app.check_idle()
