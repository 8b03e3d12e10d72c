"""Tenant keys and what the served models show them: with several models a request runs
in its key's tenant and only admins load or unload; a key that is not an admin's sees no
absolute model path (``/props``, ``/v1/models``, ``/slots``, ``/api/show``, a failed load's
error)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_http import ALIAS, SERVER_OPTIONS, fake_app
from starlette.testclient import TestClient
from test_http_tenants import KEYS_FILE, auth

from llamapy.errors import ModelLoadError
from llamapy.serve import create_app
from llamapy.serve.tenants import KeyTable
from llamapy.server import ModelManager, ModelSpec
from llamapy.server.fake import fake_server


def test_several_models_run_in_the_keys_tenant_and_only_admins_load() -> None:
    specs = [ModelSpec(name=name, path=f"{name}.gguf", memory_mb=1.0) for name in ("one", "two")]
    manager = ModelManager(specs, server_factory=lambda spec: fake_server(
        spec.path, **SERVER_OPTIONS))
    app = create_app(manager, api_keys=KeyTable.parse(KEYS_FILE), embeddings=False,
                     own_server=True)
    with TestClient(app, base_url="http://localhost") as client:
        for path in ("/models/load", "/models/unload"):
            r = client.post(path, json={"model": "two"}, headers=auth("ka"))
            assert r.status_code == 403, r.text
        assert client.post("/models/load", json={"model": "two"},
                           headers=auth("kadm")).status_code == 200
        r = client.post("/completion", headers=auth("ka"), json={
            "model": "two", "prompt": "hi", "n_predict": 2, "cache_scope": "x"})
        assert r.status_code == 200 and r.json()["generation_settings"]["tenant"] == "acme"
        admin = client.get("/slots?model=two", headers=auth("kadm")).json()
        assert [s.get("cache_scope") for s in admin if s["cached_tokens"]] == ["acme/x"]
        beta = client.get("/slots?model=two", headers=auth("kb"))
        assert all(s.get("other_tenant") for s in beta.json()) and "acme" not in beta.text


# --- no model path for a key that is not an admin's --------------------------------------------

#: Where the test server says its model is (nothing is read there: the model is the fake's).
MODEL_PATH = "/srv/llm-weights/private-dir/fake.gguf"


def test_props_show_a_tenant_key_the_model_file_name_alone() -> None:
    with fake_app(options={"model_path": MODEL_PATH},
                  app_options={"api_keys": KeyTable.parse(KEYS_FILE)}) as app:
        for key in ("ka", "kdef"):
            r = app.send("GET", "/props", headers=auth(key))
            assert r.status_code == 200, r.text
            assert r.json()["model_path"] == "fake.gguf"
            for method, path, body in (("GET", "/props", None), ("GET", "/v1/models", None),
                                       ("GET", "/slots", None),
                                       ("POST", "/api/show", {"model": ALIAS})):
                r = app.send(method, path, headers=auth(key), json=body)
                assert r.status_code == 200 and "private-dir" not in r.text, (key, path)
        admin = app.send("GET", "/props", headers=auth("kadm"))
        assert admin.json()["model_path"] == MODEL_PATH  # as llama-server shows it
    with fake_app(options={"model_path": MODEL_PATH}) as app:  # no key: unchanged
        assert app.send("GET", "/props").json()["model_path"] == MODEL_PATH


def test_a_failed_models_error_names_its_file_alone_for_a_tenant_key(tmp_path: Path) -> None:
    missing = str(tmp_path / "private-dir" / "broken.gguf")

    def server(spec: ModelSpec) -> Any:
        if spec.name == "broken":
            raise ModelLoadError(f"model file not found: {spec.path}")
        return fake_server(spec.path, **SERVER_OPTIONS)

    specs = [ModelSpec(name="one", path="one.gguf", memory_mb=1.0),
             ModelSpec(name="broken", path=missing, memory_mb=1.0)]
    app = create_app(ModelManager(specs, server_factory=server),
                     api_keys=KeyTable.parse(KEYS_FILE), embeddings=False, own_server=True)
    with TestClient(app, base_url="http://localhost") as client:
        loaded = client.post("/models/load", json={"model": "broken"}, headers=auth("kadm"))
        assert loaded.status_code >= 400
        for key in ("ka", "kdef"):
            for path in ("/v1/models", "/v1/models/broken"):
                r = client.get(path, headers=auth(key))
                assert r.status_code == 200 and "private-dir" not in r.text, (key, path)
                assert "broken.gguf" in r.text, r.text
        admin = client.get("/v1/models/broken", headers=auth("kadm"))
        assert missing in admin.json()["status"]["error"]
