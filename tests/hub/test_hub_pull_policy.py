"""Who may make the server pull, what and how much (``--pull-on-demand``): an admin's key
only when keys carry tenants (the rule of ``/models/load``), a name that spells the Hub out
(``hf.co/ORG/REPO``; a bare ``ORG/REPO`` is an unknown model), a repository within
``--pull-allow``, files within ``--pull-max-bytes`` by the Hub's listing. Each refusal is a
typed 4xx in the route's API shape, and the Hub stand-in proves what was asked of it: nothing
at all for a refused key, name or repository, the listing but no file for a pull over the cap.
The operator's own ``-hf ORG/REPO`` stays as llama-server's: a bare name, no cap."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_standin import TINY, HubStandin, blobs
from starlette.testclient import TestClient
from test_hub_on_demand import _Server

from llamapy.errors import InvalidOptionError, PullRefusedError
from llamapy.hub.fetch import HubAccess, HubFile, check_download_size
from llamapy.hub.on_demand import OnDemandPuller
from llamapy.hub.store import ModelStore
from llamapy.options.hub import (
    DEFAULT_PULL_MAX_BYTES,
    HubOptions,
    ModelRef,
    parse_model_ref,
    parse_pull_name,
    pull_allowed,
)
from llamapy.serve.__main__ import main
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.hub import hub_model_path, hub_options, hub_puller
from llamapy.serve.tenants import KeyTable
from llamapy.server import ModelManager

#: A tenant key, an admin key of the default tenant (keys carry tenants).
KEYS = "tenant-key team\nadmin-key - admin\n"
TENANT = {"Authorization": "Bearer tenant-key"}
ADMIN = {"Authorization": "Bearer admin-key"}
Q8 = f"hf.co/{TINY}:Q8_0"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class _App:
    """An app of several models with ``--pull-on-demand`` on the stand-in Hub."""

    def __init__(self, tmp_path: Path, keys: dict[str, Any], **limits: Any) -> None:
        from llamapy.serve.app import create_app

        self.manager = ModelManager([], server_factory=_Server)
        self.store = ModelStore(tmp_path / "store")
        puller = OnDemandPuller(self.manager, self.store, HubAccess.from_env(), {"n_ctx": 512},
                                **limits)
        self.app = create_app(self.manager, puller=puller, **keys)

    @contextlib.contextmanager
    def client(self) -> Iterator[TestClient]:
        with self.manager, TestClient(self.app, base_url="http://localhost") as client:
            yield client

    def pull(self, client: TestClient, name: str, headers: dict[str, str] = ADMIN) -> Any:
        return client.post("/api/pull", json={"model": name, "stream": False}, headers=headers)


def _tenancy(tmp_path: Path, **limits: Any) -> _App:
    return _App(tmp_path, {"api_keys": KeyTable.parse(KEYS)}, **limits)


def _no_file_requested(hub: HubStandin) -> bool:
    return not any("/resolve/" in path for _, path, _ in hub.requests)


def test_a_tenant_key_may_not_pull_and_the_hub_is_asked_nothing(hub: HubStandin,
                                                                tmp_path: Path) -> None:
    """/api/pull and a request naming a Hub model, in each API's shape: 403."""
    app = _tenancy(tmp_path)
    with app.client() as client:
        r = app.pull(client, Q8, TENANT)
        assert r.status_code == 403 and "admin keys only" in r.json()["error"]
        r = client.post("/api/chat", json={"model": Q8, **CHAT}, headers=TENANT)
        assert r.status_code == 403 and set(r.json()) == {"error"}
        r = client.post("/v1/chat/completions", json={"model": Q8, **CHAT}, headers=TENANT)
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        r = client.post("/v1/messages", json={"model": Q8, **CHAT}, headers=TENANT)
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert hub.requests == [] and app.manager.names == [] and app.store.entries() == []


def test_an_admin_key_pulls_then_a_tenant_key_finds_it_served(hub: HubStandin,
                                                              tmp_path: Path) -> None:
    app = _tenancy(tmp_path)
    with app.client() as client:
        assert app.pull(client, Q8).json() == {"status": "success"}
        assert app.manager.names == [Q8]
        asked = len(hub.requests)
        assert app.pull(client, Q8, TENANT).json() == {"status": "success"}
        assert len(hub.requests) == asked


def test_a_plain_key_without_tenants_still_pulls(hub: HubStandin, tmp_path: Path) -> None:
    app = _App(tmp_path, {"api_key": "plain"})
    with app.client() as client:
        r = app.pull(client, Q8, {"Authorization": "Bearer plain"})
        assert r.status_code == 200 and app.manager.names == [Q8]


@pytest.mark.parametrize("name", [f"{TINY}:Q8_0", TINY, "../../etc", "hf.co/../../etc"])
def test_a_name_that_does_not_spell_the_hub_out_pulls_nothing(name: str, hub: HubStandin,
                                                              tmp_path: Path) -> None:
    """Even an admin's bare ORG/REPO is an unknown model (404), as any other unknown name."""
    app = _tenancy(tmp_path)
    with app.client() as client:
        r = app.pull(client, name)
        assert r.status_code == 404 and set(r.json()) == {"error"}
        r = client.post("/v1/chat/completions", json={"model": name, **CHAT}, headers=ADMIN)
        assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    assert hub.requests == [] and app.manager.names == []


def test_a_repository_outside_the_allow_list_is_refused_before_the_hub(
        hub: HubStandin, tmp_path: Path) -> None:
    app = _tenancy(tmp_path, allow=("ggml-org/*", "org/other"))
    with app.client() as client:
        r = app.pull(client, Q8)
        assert r.status_code == 403 and "--pull-allow" in r.json()["error"]
        r = client.post("/v1/chat/completions", json={"model": Q8, **CHAT}, headers=ADMIN)
        assert r.status_code == 403 and "--pull-allow" in r.json()["error"]["message"]
    assert hub.requests == [] and app.manager.names == []
    app = _tenancy(tmp_path, allow=("org/tiny-*",))
    with app.client() as client:
        assert app.pull(client, Q8).status_code == 200


def test_a_listing_over_the_cap_is_refused_before_any_file(hub: HubStandin, hub_env: Path,
                                                           tmp_path: Path) -> None:
    """The split F16's two parts are 500 bytes each: the cap counts both."""
    app = _tenancy(tmp_path, max_bytes=999)
    with app.client() as client:
        for name in (Q8, f"hf.co/{TINY}:F16"):
            r = app.pull(client, name)
            assert r.status_code == 403 and "--pull-max-bytes" in r.json()["error"]
    assert hub.requests and _no_file_requested(hub)
    assert blobs(hub_env) == [] and app.manager.names == [] and app.store.entries() == []
    app = _tenancy(tmp_path, max_bytes=1000)
    with app.client() as client:
        assert app.pull(client, f"hf.co/{TINY}:F16").status_code == 200


def test_a_listing_without_a_size_is_refused_under_a_cap() -> None:
    ref = ModelRef(TINY, "Q8_0")
    with pytest.raises(PullRefusedError, match="no size") as caught:
        check_download_size(ref, (HubFile("a.gguf", 10), HubFile("b.gguf", None)), 100)
    assert caught.value.http_status == 403 and caught.value.limit == 100
    check_download_size(ref, (HubFile("a.gguf", None),), 0)  # 0: no cap


def test_pull_names_need_the_hub_host_and_the_operators_names_do_not() -> None:
    assert parse_pull_name(Q8) == parse_pull_name(f"huggingface.co/{TINY}:q8_0") == ModelRef(
        TINY, "Q8_0")
    for bad in (f"{TINY}:Q8_0", TINY, "../../etc", "hf.co/../../etc", "hf.co/evil/x:", ""):
        with pytest.raises(InvalidOptionError):
            parse_pull_name(bad)
    assert parse_model_ref(f"{TINY}:Q8_0") == ModelRef(TINY, "Q8_0")  # -hf, python -m llamapy
    assert pull_allowed(TINY, ()) and pull_allowed(TINY, ("org/*",))
    assert not pull_allowed(TINY, ("ORG/*", "org/tiny", "org-evil/*"))


def test_the_pull_flags_reach_the_puller(hub_env: Path) -> None:
    args = build_parser().parse_args([
        "--models-dir", str(hub_env), "--pull-on-demand", "--pull-allow", "a/*,b/c",
        "--pull-allow", "d/e", "--pull-max-bytes", "100"])
    options = hub_options(args)
    assert (options.pull_allow, options.pull_max_bytes) == (("a/*", "b/c", "d/e"), 100)
    puller = hub_puller(options, ModelManager([], server_factory=_Server), str(hub_env), {})
    assert (puller.allow, puller.max_bytes) == (("a/*", "b/c", "d/e"), 100)
    plain = hub_options(build_parser().parse_args(["--models-dir", ".", "--pull-on-demand"]))
    assert (plain.pull_allow, plain.pull_max_bytes) == ((), DEFAULT_PULL_MAX_BYTES)


@pytest.mark.parametrize("argv", [
    ["--pull-allow", "org/*"],  # without --pull-on-demand
    ["--pull-on-demand", "--models-dir", ".", "--pull-allow", "../../etc"],
    ["--pull-on-demand", "--models-dir", ".", "--pull-allow", "org"],
    ["--pull-on-demand", "--models-dir", ".", "--pull-allow", ","],
    ["--pull-on-demand", "--models-dir", ".", "--pull-max-bytes", "-1"],
])
def test_bad_pull_limits_are_refused_before_anything_loads(
        argv: list[str], hub_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "pull" in capsys.readouterr().err


def test_the_operators_hf_repo_takes_a_bare_name_and_no_cap(hub: HubStandin) -> None:
    """``-hf ORG/REPO:QUANT`` downloads as llama-server's, whatever the request-pull cap."""
    options = HubOptions(hf_repo=f"{TINY}:Q4_K_M", pull_on_demand=True, pull_max_bytes=1)
    path = hub_model_path(options)
    assert path is not None and path.name == "tiny-Q4_K_M.gguf" and path.stat().st_size > 1
