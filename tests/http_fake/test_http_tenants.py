"""Tenants bound to API keys over HTTP, on the fake backend (:mod:`llamapy.serve.tenants`,
:mod:`llamapy.serve.pages.tenant_view`, :mod:`llamapy.serve.routes.slot_files`).

The module's app has two tenant keys (``acme``, ``beta``), an admin of tenant ``ops`` and a key
alone (the default tenant, no admin rights); its fake model has FIM tokens, so ``/infill``
generates too. Every engine request is recorded on the tick thread, so a test sees the tenant
each route submitted with.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_http import ALIAS, FakeApp, fake_app, feed_frame, sse_events

from llamapy.engine import Engine
from llamapy.engine.fake.text import FakeTextModel
from llamapy.serve.pages.tenant_view import BARE_FIELDS, feed_view
from llamapy.serve.tenants import KeyTable, Principal

KEYS_FILE = """\
# tenants of the test server
ka acme
kb beta
kadm ops admin

kdef
"""
#: Each key's tenant (None: the default tenant).
TENANT_OF = {"ka": "acme", "kb": "beta", "kadm": "ops", "kdef": None}
MESSAGES = [{"role": "user", "content": "hi"}]


class FimModel(FakeTextModel):
    """The fake model with fill-in-the-middle tokens (three word tokens)."""

    @property
    def fim_tokens(self) -> dict[str, int]:
        """``pre``, ``suf`` and ``mid`` only."""
        return {"pre": 1, "suf": 2, "mid": 3, "pad": -1, "rep": -1, "sep": -1}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def record_tenants(app: FakeApp) -> list[str | None]:
    """The tenant of every request the engine is given from now on (recorded on the tick
    thread, in submission order)."""
    seen: list[str | None] = []

    def install(engine: Engine) -> None:
        submit = engine.submit

        def recording(request: Any) -> None:
            seen.append(request.options.tenant)
            submit(request)

        engine.submit = recording  # type: ignore[method-assign]

    app.server.call(install)
    return seen


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeApp]:
    folder = tmp_path_factory.mktemp("tenant-slots")
    with fake_app(slot_folder=folder, options={"model": FimModel()},
                  app_options={"api_keys": KeyTable.parse(KEYS_FILE)}) as served:
        yield served


@pytest.fixture(scope="module")
def submitted(tenants: FakeApp) -> list[str | None]:
    return record_tenants(tenants)


# --- every generation route runs in the key's tenant -------------------------------------------

GENERATIONS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3}),
    ("/chat/completions", {"messages": MESSAGES, "max_tokens": 3}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 3}),
    ("/completion", {"prompt": "hi", "n_predict": 3}),
    ("/infill", {"input_prefix": "def f(", "input_suffix": "):", "n_predict": 3}),
    ("/v1/messages", {"model": ALIAS, "messages": MESSAGES, "max_tokens": 3}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 3}),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("path", "body"), GENERATIONS)
def test_every_generation_route_submits_with_the_keys_tenant(
        tenants: FakeApp, submitted: list[str | None], path: str, body: dict[str, Any],
        stream: bool) -> None:
    for key, tenant in TENANT_OF.items():
        submitted.clear()
        r = tenants.send("POST", path, json={**body, "stream": stream}, headers=auth(key))
        assert r.status_code == 200, r.text
        if stream:  # no error event (named, or a data object with an "error")
            events = sse_events(r.text)
            assert events and all(name != "error" and not data.startswith('{"error"')
                                  for name, data in events), r.text
        assert submitted == [tenant], (key, path)
    tenants.check_idle()


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}),
    ("/completion", {"prompt": "hi", "n_predict": 2}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
    ("/v1/messages", {"model": ALIAS, "messages": MESSAGES, "max_tokens": 2}),
])
def test_a_body_cannot_name_a_tenant(tenants: FakeApp, submitted: list[str | None], path: str,
                                     body: dict[str, Any]) -> None:
    submitted.clear()
    r = tenants.send("POST", path, json={**body, "tenant": "beta"}, headers=auth("ka"))
    assert r.status_code == 400, r.text
    assert "tenant cannot be set over HTTP" in r.text
    assert submitted == []


# --- reuse never crosses tenants ---------------------------------------------------------------


def cached(app: FakeApp, key: str, prompt: str, **options: Any) -> int:
    """The prompt tokens reused for ``key``'s ``/completion`` of ``prompt``."""
    r = app.send("POST", "/completion", headers=auth(key), json={
        "prompt": prompt, "n_predict": 2, **options})
    assert r.status_code == 200, r.text
    assert int(r.headers["X-Llamapy-Cache-Tokens"]) == r.json()["timings"]["cache_n"]
    return int(r.json()["timings"]["cache_n"])


def test_reuse_stays_inside_a_tenant(tenants: FakeApp) -> None:
    prompt = "a long shared system prompt, then the question"
    assert cached(tenants, "ka", prompt) == 0
    assert cached(tenants, "ka", prompt) > 0  # within a tenant: reused
    for key in ("kb", "kadm", "kdef"):  # the same prompt, another tenant: nothing
        assert cached(tenants, key, prompt) == 0, key
        assert cached(tenants, key, prompt) > 0, key
    tenants.check_idle()


@pytest.mark.parametrize(("scope_a", "scope_b"), [
    ("team", "team"),  # the same sub-scope name in two tenants
    ("beta", None),    # a sub-scope named after the other tenant
])
def test_a_client_scope_is_a_sub_scope_inside_the_tenant(tenants: FakeApp, scope_a: str,
                                                         scope_b: str | None) -> None:
    prompt = f"scoped prompt for {scope_a} and {scope_b}, long enough to reuse"
    b_options = {} if scope_b is None else {"cache_scope": scope_b}
    assert cached(tenants, "kb", prompt, **b_options) == 0
    assert cached(tenants, "kb", prompt, **b_options) > 0
    assert cached(tenants, "ka", prompt, cache_scope=scope_a) == 0
    assert cached(tenants, "ka", prompt, cache_scope=scope_a) > 0
    assert cached(tenants, "kb", prompt, **b_options) > 0  # its own, still
    tenants.check_idle()


def test_a_chat_reports_no_cached_tokens_across_tenants(tenants: FakeApp) -> None:
    body = {"messages": [{"role": "user", "content": "the same question, asked twice"}],
            "max_tokens": 2}

    def cached_tokens(key: str) -> int:
        r = tenants.send("POST", "/v1/chat/completions", json=body, headers=auth(key))
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    cached_tokens("kb")
    assert cached_tokens("kb") > 0
    assert cached_tokens("ka") == 0
    tenants.check_idle()


# --- what each key sees ------------------------------------------------------------------------


def fill_slots(app: FakeApp) -> None:
    """Slot 0: acme's KV (sub-scope ``sub-a``, session ``sess-a``); slot 1: beta's (both
    emptied by the admin first: ``id_slot`` takes no slot holding another tenant's KV)."""
    for slot in (0, 1):
        assert act(app, "kadm", slot, "erase").status_code == 200
    for key, slot, name in (("ka", 0, "a"), ("kb", 1, "b")):
        r = app.send("POST", "/completion", headers=auth(key), json={
            "prompt": f"the prompt of tenant {name}", "n_predict": 2, "id_slot": slot,
            "cache_scope": f"sub-{name}", "session": f"sess-{name}"})
        assert r.status_code == 200, r.text
    app.check_idle()


def slots_of(app: FakeApp, key: str) -> list[dict[str, Any]]:
    r = app.send("GET", "/slots", headers=auth(key))
    assert r.status_code == 200, r.text
    return list(r.json())


def check_tenant_view(slots: list[dict[str, Any]], own: int | None) -> None:
    """Slot ``own`` in full, the other bare."""
    for slot in slots:
        if slot["id"] == own:
            assert "other_tenant" not in slot and slot["cached_tokens"] > 0
        else:
            assert slot == {**{k: slot[k] for k in BARE_FIELDS}, "other_tenant": True}


def test_slots_show_a_tenant_only_its_own(tenants: FakeApp) -> None:
    fill_slots(tenants)
    acme = slots_of(tenants, "ka")
    check_tenant_view(acme, own=0)
    assert (acme[0]["cache_scope"], acme[0]["session"]) == ("sub-a", repr("sess-a"))
    beta = slots_of(tenants, "kb")
    check_tenant_view(beta, own=1)
    assert (beta[1]["cache_scope"], beta[1]["tenant"]) == ("sub-b", "beta")
    check_tenant_view(slots_of(tenants, "kdef"), own=None)
    for key, others in (("ka", ("sub-b", "sess-b", "beta")), ("kb", ("sub-a", "sess-a", "acme")),
                        ("kdef", ("sub-a", "sub-b", "acme", "beta", "sess"))):
        text = tenants.send("GET", "/slots", headers=auth(key)).text
        assert not any(name in text for name in others), key


def test_an_admin_sees_every_slot_with_its_tenant(tenants: FakeApp) -> None:
    fill_slots(tenants)
    slots = slots_of(tenants, "kadm")
    assert [(s["tenant"], s["cache_scope"], s["session"]) for s in slots] == [
        ("acme", "acme/sub-a", repr("sess-a")), ("beta", "beta/sub-b", repr("sess-b"))]


def test_the_events_feed_shows_slots_as_slots_does(tenants: FakeApp) -> None:
    fill_slots(tenants)
    acme = feed_frame(tenants, "ka")
    check_tenant_view(acme["slots"], own=0)
    assert acme["slots"][0]["cache_scope"] == "sub-a" and acme["recent_instability"] == []
    assert "sub-b" not in json.dumps(acme) and "sess-b" not in json.dumps(acme)
    admin = feed_frame(tenants, "kadm")
    assert [s["cache_scope"] for s in admin["slots"]] == ["acme/sub-a", "beta/sub-b"]


def test_metrics_are_for_admins(tenants: FakeApp) -> None:
    assert tenants.send("GET", "/metrics", headers=auth("kadm")).status_code == 200
    for key in ("ka", "kb", "kdef"):
        r = tenants.send("GET", "/metrics", headers=auth(key))
        assert r.status_code == 403
        assert r.json()["error"]["type"] == "permission_error"
    assert tenants.send("GET", "/metrics", headers=auth("nope")).status_code == 401


# --- slot actions ------------------------------------------------------------------------------


def act(app: FakeApp, key: str, slot: int, action: str, filename: str | None = None
        ) -> Any:
    body = None if filename is None else {"filename": filename}
    return app.send("POST", f"/slots/{slot}?action={action}", headers=auth(key), json=body)


@pytest.mark.parametrize("stream", [False, True])
def test_id_slot_never_takes_another_tenants_slot(tenants: FakeApp, stream: bool) -> None:
    fill_slots(tenants)
    before = slots_of(tenants, "kadm")
    for path, body in (("/completion", {"prompt": "beta names acme's slot", "n_predict": 2}),
                       ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2})):
        r = tenants.send("POST", path, headers=auth("kb"),
                         json={**body, "id_slot": 0, "stream": stream})
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "permission_error"
        assert "acme" not in r.text and "sub-a" not in r.text
    assert slots_of(tenants, "kadm") == before  # acme's KV, scope and session untouched
    r = tenants.send("POST", "/completion", headers=auth("kb"), json={
        "prompt": "beta on its own slot", "n_predict": 2, "id_slot": 1, "stream": stream})
    assert r.status_code == 200, r.text
    tenants.check_idle()


def test_a_tenant_acts_only_on_its_own_slots(tenants: FakeApp) -> None:
    fill_slots(tenants)
    assert act(tenants, "kb", 1, "save", "x.bin").status_code == 200  # its own: fine
    for action, filename in (("save", "x.bin"), ("restore", "x.bin"), ("erase", None)):
        r = act(tenants, "kb", 0, action, filename)
        assert r.status_code == 403, (action, r.text)
        assert r.json()["error"]["type"] == "permission_error"
        assert "acme" not in r.text and "sub-a" not in r.text
    assert act(tenants, "kdef", 1, "erase").status_code == 403
    assert slots_of(tenants, "ka")[0]["cached_tokens"] > 0  # untouched
    assert act(tenants, "ka", 0, "erase").json()["n_erased"] > 0
    assert act(tenants, "kb", 0, "erase").json()["n_erased"] == 0  # empty: anyone's
    assert act(tenants, "kadm", 1, "erase").json()["n_erased"] > 0  # an admin: any slot


def test_slot_files_live_in_the_tenants_folder(tenants: FakeApp) -> None:
    folder = tenants.slot_folder
    assert folder is not None
    fill_slots(tenants)
    assert act(tenants, "ka", 0, "save", "mine.bin").status_code == 200
    assert (folder / "tenant=acme" / "mine.bin").is_file()
    assert not (folder / "mine.bin").exists()
    # beta's folder has no such file; a copy of acme's put there is refused
    assert act(tenants, "kb", 1, "restore", "mine.bin").status_code == 400
    (folder / "tenant=beta").mkdir(exist_ok=True)
    shutil.copy(folder / "tenant=acme" / "mine.bin", folder / "tenant=beta" / "mine.bin")
    r = act(tenants, "kb", 1, "restore", "mine.bin")
    assert r.status_code == 403 and "another tenant" in r.text
    # acme restores its file into an empty slot (beta's KV erased by its owner first)
    assert act(tenants, "ka", 1, "restore", "mine.bin").status_code == 403
    assert act(tenants, "kb", 1, "erase").status_code == 200
    restored = act(tenants, "ka", 1, "restore", "mine.bin")
    assert restored.status_code == 200 and restored.json()["n_restored"] > 0
    assert [s.get("tenant") for s in slots_of(tenants, "kadm")] == ["acme", "acme"]
    assert "sess-b" not in tenants.send("GET", "/slots", headers=auth("ka")).text
    # saving needs the slot's KV to be one's own, even an emptied slot's
    assert act(tenants, "ka", 0, "erase").status_code == 200
    assert act(tenants, "kdef", 0, "save", "plain.bin").status_code == 403
    assert not (folder / "plain.bin").exists()
    tenants.check_idle()


def test_the_default_tenant_saves_into_the_folder_itself(tenants: FakeApp) -> None:
    folder = tenants.slot_folder
    assert folder is not None
    r = tenants.send("POST", "/completion", headers=auth("kdef"), json={
        "prompt": "the default tenant's prompt", "n_predict": 2, "id_slot": 0})
    assert r.status_code == 200
    assert act(tenants, "kdef", 0, "save", "default.bin").status_code == 200
    assert (folder / "default.bin").is_file()
    assert act(tenants, "kadm", 0, "save", "by-admin.bin").status_code == 200
    assert (folder / "tenant=ops" / "by-admin.bin").is_file()


# --- without tenants: as before ----------------------------------------------------------------


@pytest.mark.parametrize("keys", [{"api_key": "k1, k2"},
                                  {"api_keys": KeyTable.parse("k1\n# c\nk2\n")}])
def test_keys_without_tenants_keep_todays_behaviour(tmp_path: Path, keys: dict[str, Any]
                                                    ) -> None:
    with fake_app(slot_folder=tmp_path, app_options=keys) as app:
        seen = record_tenants(app)
        r = app.send("POST", "/completion", headers=auth("k1"), json={
            "prompt": "hello there", "n_predict": 2, "id_slot": 0, "cache_scope": "s",
            "session": "u"})
        assert r.status_code == 200 and seen == [None]
        slot = slots_of(app, "k2")[0]
        assert (slot["cache_scope"], slot["session"], slot["tenant"]) == ("s", repr("u"), None)
        assert app.send("GET", "/metrics", headers=auth("k2")).status_code == 200
        assert act(app, "k2", 0, "save", "s.bin").status_code == 200
        assert (tmp_path / "s.bin").is_file()
        assert act(app, "k1", 0, "erase").json()["n_erased"] > 0
        assert app.send("GET", "/slots", headers=auth("k3")).status_code == 401



def test_a_tenant_feed_drops_the_instability_events() -> None:
    frame = {"slots": [], "recent_instability": [{"request_id": "'chatcmpl-b'", "slot_id": 1}]}
    assert feed_view(frame, Principal("acme", False))["recent_instability"] == []
    assert feed_view(frame, Principal("ops", True)) == frame
