"""llama-server's slot actions (``POST /slots/{id}?action=save|restore|erase``) on the real
model: round trip, reuse after restore, llama-server's response fields, and bad input."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from http_helpers import MODEL_ALIAS
from live import LiveApp

from llamapy.serve import create_app
from llamapy.server import Server

PROMPT = "The three primary colours are red, yellow and blue. Mixing red and blue gives"


@pytest.fixture(scope="module")
def saving(model_path: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[httpx.Client, Path]]:
    folder = tmp_path_factory.mktemp("slots")
    with Server(model_path, n_ctx=2048, n_parallel=2, n_threads=1) as server, \
            LiveApp(create_app(server, alias=MODEL_ALIAS, slot_save_path=str(folder))) as app, \
            httpx.Client(base_url=app.url, timeout=120) as client:
        server.wait_ready(60)
        yield client, folder


def complete(http: httpx.Client) -> dict:
    done = http.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "temperature": 0})
    assert done.status_code == 200, done.text
    return done.json()


def busy_slot(http: httpx.Client) -> dict:
    return max(http.get("/slots").json(), key=lambda s: s["cached_tokens"])


def test_save_erase_restore_then_reuse(saving: tuple[httpx.Client, Path]) -> None:
    http, folder = saving
    first = complete(http)
    slot = busy_slot(http)
    sid, cached = slot["id"], slot["cached_tokens"]
    saved = http.post(f"/slots/{sid}?action=save", json={"filename": "colours.bin"}).json()
    assert saved["id_slot"] == sid and saved["filename"] == "colours.bin"
    assert saved["n_saved"] == cached
    assert saved["n_written"] == (folder / "colours.bin").stat().st_size
    assert saved["timings"]["save_ms"] >= 0
    erased = http.post(f"/slots/{sid}?action=erase").json()
    assert erased == {"id_slot": sid, "n_erased": cached}
    assert all(s["cached_tokens"] == 0 for s in http.get("/slots").json() if s["id"] == sid)
    restored = http.post(f"/slots/{sid}?action=restore", json={"filename": "colours.bin"}).json()
    assert restored["n_restored"] == cached and restored["n_read"] == saved["n_written"]
    again = complete(http)
    assert again["timings"]["cache_n"] >= first["tokens_evaluated"] - 1  # reused, not recomputed


@pytest.mark.parametrize(("query", "body", "status", "says"), [
    ("action=save", {"filename": "../escape.bin"}, 400, "Invalid filename"),
    ("action=save", {"filename": ".hidden"}, 400, "Invalid filename"),
    ("action=save", {}, 400, "Invalid filename"),
    ("action=restore", {"filename": "missing.bin"}, 400, "cannot read"),
    ("action=launch", {"filename": "x.bin"}, 400, "Invalid action"),
])
def test_bad_slot_actions_are_400(saving: tuple[httpx.Client, Path], query: str, body: dict,
                                  status: int, says: str) -> None:
    http, _ = saving
    bad = http.post(f"/slots/0?{query}", json=body)
    assert bad.status_code == status, bad.text
    assert says in bad.json()["error"]["message"]


def test_unknown_slot_is_400(saving: tuple[httpx.Client, Path]) -> None:
    http, _ = saving
    bad = http.post("/slots/7?action=erase")
    assert bad.status_code == 400 and "invalid slot id" in bad.json()["error"]["message"]


@pytest.mark.parametrize("damage", ["magic", "header", "body", "truncate"])
def test_a_damaged_file_is_refused_and_the_server_answers(
        saving: tuple[httpx.Client, Path], damage: str) -> None:
    http, folder = saving
    complete(http)
    sid = busy_slot(http)["id"]
    assert http.post(f"/slots/{sid}?action=save", json={"filename": "d.bin"}).status_code == 200
    data = bytearray((folder / "d.bin").read_bytes())
    if damage == "magic":
        data[0] ^= 0xFF
    elif damage == "header":
        data[14] ^= 0xFF
    elif damage == "body":
        data[-10] ^= 0xFF
    else:
        del data[len(data) // 2:]
    (folder / "d.bin").write_bytes(bytes(data))
    bad = http.post(f"/slots/{sid}?action=restore", json={"filename": "d.bin"})
    assert bad.status_code == 400, bad.text
    assert "Unable to restore slot" in bad.json()["error"]["message"]
    assert complete(http)["tokens_predicted"] >= 1


def test_without_a_save_path_the_actions_are_501(http: httpx.Client) -> None:
    bad = http.post("/slots/0?action=save", json={"filename": "x.bin"})
    assert bad.status_code == 501
    assert "--slot-save-path" in bad.json()["error"]["message"]


def test_actions_are_served_without_the_slots_listing(server: Server, tmp_path: Path) -> None:
    app = create_app(server, alias=MODEL_ALIAS, slots=False, slot_save_path=str(tmp_path))
    with LiveApp(app) as live, httpx.Client(base_url=live.url, timeout=120) as http:
        assert http.get("/slots").status_code == 501  # --no-slots hides the listing only
        complete(http)
        saved = http.post("/slots/0?action=save", json={"filename": "listing-off.bin"})
        assert saved.status_code == 200, saved.text
        assert saved.json()["filename"] == "listing-off.bin"
        assert (tmp_path / "listing-off.bin").stat().st_size == saved.json()["n_written"]


def pinned(http: httpx.Client, prompt: str, slot: int) -> dict:
    done = http.post("/completion", json={"prompt": prompt, "n_predict": 2, "temperature": 0,
                                          "id_slot": slot})
    assert done.status_code == 200, done.text
    return done.json()


def test_id_slot_pins_the_request_and_the_response_names_it(
        saving: tuple[httpx.Client, Path]) -> None:
    http, _ = saving
    for sid in (1, 0, 1):
        done = pinned(http, f"{PROMPT} (slot {sid})", sid)
        assert done["id_slot"] == sid
        slot = next(s for s in http.get("/slots").json() if s["id"] == sid)
        assert slot["cached_tokens"] >= done["tokens_evaluated"]
    body = {"prompt": PROMPT, "n_predict": 2, "temperature": 0, "id_slot": 3, "stream": True}
    with http.stream("POST", "/completion", json=body) as streamed:
        chunks = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert chunks and all('"id_slot":1' in c.replace(" ", "") for c in chunks)  # 3 wraps to 1


def test_llama_server_slot_workflow_pin_save_restore_elsewhere(
        saving: tuple[httpx.Client, Path]) -> None:
    http, _ = saving
    pinned(http, PROMPT, 1)
    assert http.post("/slots/1?action=save", json={"filename": "pinned.bin"}).status_code == 200
    assert http.post("/slots/1?action=erase").status_code == 200
    assert http.post("/slots/0?action=erase").status_code == 200
    restored = http.post("/slots/0?action=restore", json={"filename": "pinned.bin"})
    assert restored.status_code == 200, restored.text
    again = pinned(http, PROMPT, 0)
    assert again["id_slot"] == 0
    assert again["timings"]["cache_n"] >= again["tokens_evaluated"] - 1  # slot 0's restored KV


@pytest.mark.parametrize("bad", [-2, "one", 1.5])
def test_a_bad_id_slot_is_a_400_and_the_server_stays_up(
        saving: tuple[httpx.Client, Path], bad: object) -> None:
    http, _ = saving
    refused = http.post("/completion", json={"prompt": PROMPT, "n_predict": 2, "id_slot": bad})
    assert refused.status_code == 400, refused.text
    assert "slot_id" in refused.text
    assert pinned(http, PROMPT, 0)["id_slot"] == 0
