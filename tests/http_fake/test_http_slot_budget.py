"""The slot files' budgets and safe writes (:mod:`llamapy.serve.slot_store`), over HTTP on the
fake backend: per tenant and for the folder, in files and bytes, counted from the folder at
start; a save past one is a 403 that writes nothing; temp files of random names, created
exclusively, renamed into place; no symlink in the folder followed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fake_http import FakeApp, fake_app

from llamapy.errors import InvalidRequestError, SlotFileBudgetError
from llamapy.options.serve import ServeOptions
from llamapy.serve import slot_store
from llamapy.serve.slot_store import SlotBudget, SlotStore
from llamapy.serve.tenants import KeyTable

KEYS = KeyTable.parse("ka acme\nkb beta\nkadm ops admin\nkroot - admin\n")
MB = 1024 * 1024


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def app_on(folder: Path, **budgets: Any) -> Iterator[FakeApp]:
    """An app with tenant keys whose slot files are in ``folder``, within ``budgets``."""
    with fake_app(slot_folder=folder, app_options={"api_keys": KEYS, **budgets}) as app:
        yield app


def fill(app: FakeApp, key: str, slot: int) -> None:
    """Put ``key``'s KV on ``slot`` (emptied first by the admin)."""
    assert act(app, "kadm", slot, "erase").status_code == 200
    r = app.send("POST", "/completion", headers=auth(key), json={
        "prompt": f"the prompt of {key}, a few words long", "n_predict": 2, "id_slot": slot})
    assert r.status_code == 200, r.text


def act(app: FakeApp, key: str, slot: int, action: str, filename: str | None = None) -> Any:
    body = None if filename is None else {"filename": filename}
    return app.send("POST", f"/slots/{slot}?action={action}", headers=auth(key), json=body)


def check_refused(r: Any, option: str) -> None:
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["type"] == "permission_error" and error["param"] == option, error
    assert error["code"] == "slot_file_budget_exceeded"


def files_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def test_a_tenant_saves_no_more_files_than_its_budget(tmp_path: Path) -> None:
    with app_on(tmp_path, slot_save_tenant_max_files=2) as app:
        fill(app, "ka", 0)
        fill(app, "kb", 1)
        for name in ("a.bin", "b.bin"):
            assert act(app, "ka", 0, "save", name).status_code == 200
        check_refused(act(app, "ka", 0, "save", "c.bin"), "slot_save_tenant_max_files")
        assert not (tmp_path / "tenant=acme" / "c.bin").exists()
        assert act(app, "ka", 0, "save", "a.bin").status_code == 200  # replacing: room
        assert act(app, "kb", 1, "save", "c.bin").status_code == 200  # beta: its own budget
        assert act(app, "ka", 0, "restore", "b.bin").json()["n_restored"] > 0
        assert files_in(tmp_path) == ["tenant=acme/a.bin", "tenant=acme/b.bin",
                                      "tenant=beta/c.bin"]  # (no temp file left)


def test_the_folders_budget_holds_every_tenant_and_a_restart_keeps_it(tmp_path: Path) -> None:
    with app_on(tmp_path, slot_save_max_files=2) as app:
        fill(app, "ka", 0)
        fill(app, "kb", 1)
        assert act(app, "ka", 0, "save", "a.bin").status_code == 200
        assert act(app, "kb", 1, "save", "b.bin").status_code == 200
        check_refused(act(app, "kb", 1, "save", "c.bin"), "slot_save_max_files")
    with app_on(tmp_path, slot_save_max_files=2) as app:  # a restart counts the folder
        fill(app, "kb", 1)
        check_refused(act(app, "kb", 1, "save", "c.bin"), "slot_save_max_files")
        check_refused(act(app, "kadm", 1, "save", "d.bin"), "slot_save_max_files")
        assert act(app, "kb", 1, "save", "b.bin").status_code == 200
    assert files_in(tmp_path) == ["tenant=acme/a.bin", "tenant=beta/b.bin"]


def test_a_save_past_a_byte_budget_writes_nothing(tmp_path: Path) -> None:
    with app_on(tmp_path) as app:
        fill(app, "ka", 0)
        size = act(app, "ka", 0, "save", "first.bin").json()["n_written"]
    for option in ("slot_save_tenant_max_mb", "slot_save_max_mb"):
        with app_on(tmp_path, **{option: 1.5 * size / MB}) as app:  # room for one file
            fill(app, "ka", 0)
            check_refused(act(app, "ka", 0, "save", "second.bin"), option)
            assert act(app, "ka", 0, "save", "first.bin").status_code == 200  # no larger
    assert files_in(tmp_path) == ["tenant=acme/first.bin"]


def test_the_default_budgets_come_from_the_option_tree(tmp_path: Path) -> None:
    store = SlotStore(tmp_path, SlotBudget.of(ServeOptions()))
    assert store.budget == SlotBudget(16384 * MB, 1024, 4096 * MB, 128)
    store.save(None, "x.bin", b"12345")
    assert store.usage(None) == store.total() == (5, 1)
    with pytest.raises(SlotFileBudgetError, match="slot_save_tenant_max_files"):
        SlotStore(tmp_path, SlotBudget(tenant_max_files=1)).check_room(None, "y.bin")
    with pytest.raises(SlotFileBudgetError, match="slot_save_max_mb"):
        SlotStore(tmp_path, SlotBudget(max_bytes=9)).check_room("t", "x.bin", 5)


# --- safe files ----------------------------------------------------------------------------------


def test_a_symlink_at_the_old_predictable_temp_name_is_not_written_through(
        tmp_path: Path) -> None:
    folder, victim = tmp_path / "slots", tmp_path / "victim.txt"
    victim.write_bytes(b"keep me")
    with app_on(folder) as app:
        fill(app, "ka", 0)
        (folder / "tenant=acme").mkdir(parents=True, exist_ok=True)
        (folder / "tenant=acme" / f".a.bin.{os.getpid()}.tmp").symlink_to(victim)
        assert act(app, "ka", 0, "save", "a.bin").status_code == 200
    assert victim.read_bytes() == b"keep me"
    assert not (folder / "tenant=acme" / "a.bin").is_symlink()


def test_a_temp_file_is_created_exclusively(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    store = SlotStore(tmp_path / "slots")
    monkeypatch.setattr(slot_store.secrets, "token_hex", lambda n: "guessed")
    (tmp_path / "slots" / ".slot-guessed.tmp").symlink_to(victim)
    with pytest.raises(InvalidRequestError, match="cannot write"):
        store.save(None, "a.bin", b"data")
    assert victim.read_text() == "keep me" and store.usage(None) == (0, 0)


def test_no_symlink_planted_in_the_folder_is_followed(tmp_path: Path) -> None:
    folder, elsewhere, secret = tmp_path / "slots", tmp_path / "elsewhere", tmp_path / "secret"
    folder.mkdir()
    elsewhere.mkdir()
    secret.write_bytes(b"LLPYSLOT not a slot file of ours")
    (folder / "tenant=acme").symlink_to(elsewhere, target_is_directory=True)
    (folder / "planted.bin").symlink_to(secret)
    (folder / "victim.bin").symlink_to(secret)
    with app_on(folder) as app:
        fill(app, "ka", 0)
        r = act(app, "ka", 0, "save", "a.bin")  # acme's folder is a symlink: refused
        assert r.status_code == 400 and "not a plain folder" in r.text, r.text
        assert list(elsewhere.iterdir()) == []
        fill(app, "kroot", 1)  # the default tenant's files: in the folder itself
        r = act(app, "kroot", 1, "restore", "planted.bin")
        assert r.status_code == 400 and "cannot read" in r.text, r.text
        assert act(app, "kroot", 1, "save", "victim.bin").status_code == 200
    assert secret.read_bytes() == b"LLPYSLOT not a slot file of ours"
    assert (folder / "victim.bin").is_file() and not (folder / "victim.bin").is_symlink()


def test_a_store_whose_folder_went_away_answers_a_400(tmp_path: Path) -> None:
    store = SlotStore(tmp_path / "slots")
    (tmp_path / "slots").rmdir()
    with pytest.raises(InvalidRequestError, match="cannot write"):
        store.save("acme", "a.bin", b"data")
    with pytest.raises(InvalidRequestError, match="cannot read"):
        store.read("acme", "a.bin")
    with pytest.raises(InvalidRequestError, match="not a tenant name"):
        SlotStore(tmp_path / "other").save("../up", "a.bin", b"data")
    assert store.total() == (0, 0)


def test_saves_and_restores_under_way_are_bounded(tmp_path: Path) -> None:
    """Each holds a slot's KV in memory: past MAX_MOVING at once, one more is a 429 with
    nothing read or written."""
    with app_on(tmp_path) as app:
        fill(app, "ka", 0)
        assert act(app, "ka", 0, "save", "a.bin").status_code == 200
        store = app.client.app.state.llamapy.slot_store  # type: ignore[attr-defined]
        with contextlib.ExitStack() as held:
            for _ in range(slot_store.MAX_MOVING):
                held.enter_context(store.moving())
            for action in ("save", "restore"):
                r = act(app, "ka", 0, action, "a.bin")
                assert r.status_code == 429, r.text
        assert act(app, "ka", 0, "restore", "a.bin").status_code == 200
        assert files_in(tmp_path) == ["tenant=acme/a.bin"]
