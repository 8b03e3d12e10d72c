"""Background responses (``background: true``) on the fake app: answered at once as
``queued``, polled to ``completed``; cancelled (the slot freed, the object ``cancelled``);
refused when they could not be polled (``store: false``, ``stream``, no store); another
tenant's a 404; not continued while running; a response whose server stopped reads
``failed``; the server's shutdown cancels and records what runs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_http import ALIAS, FakeApp, keyed_app
from test_http_tenants import KEYS_FILE
from ws_helpers import auth

from llamapy.openai_api.response_store import ResponseStore
from llamapy.openai_api.responses_background import OWNER

BASE = {"model": ALIAS, "temperature": 0, "input": "Tell me a long story."}
#: Bound on a background response's run (a bound, not a speed figure).
POLL_S = 20.0


@pytest.fixture(scope="module")
def app() -> Iterator[FakeApp]:
    """Keyed tenants; each decode step sleeps, so a long answer runs long enough to cancel."""
    with keyed_app(KEYS_FILE, sleep_s=0.005) as served:
        yield served


def create(app: FakeApp, key: str = "ka", **body: Any) -> dict[str, Any]:
    r = app.send("POST", "/v1/responses", json={**BASE, "background": True, **body},
                 headers=auth(key))
    assert r.status_code == 200, r.text
    return dict(r.json())


def get(app: FakeApp, response_id: str, key: str = "ka") -> dict[str, Any]:
    r = app.send("GET", f"/v1/responses/{response_id}", headers=auth(key))
    assert r.status_code == 200, r.text
    return dict(r.json())


def until_ended(app: FakeApp, response_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + POLL_S
    while (found := get(app, response_id))["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline, found
        time.sleep(0.02)
    return found


def test_a_background_response_is_queued_then_polled_to_its_end(app: FakeApp) -> None:
    queued = create(app, max_output_tokens=6)
    assert queued["status"] == "queued" and queued["background"] is True
    assert queued["output"] == [] and queued["usage"] is None
    done = until_ended(app, queued["id"])
    assert done["status"] in ("completed", "incomplete") and done["background"] is True
    assert done["output"] and done["usage"]["output_tokens"] > 0
    assert OWNER not in done
    go_on = app.send("POST", "/v1/responses", headers=auth(), json={
        **BASE, "input": "And then?", "previous_response_id": done["id"],
        "max_output_tokens": 2})
    assert go_on.status_code == 200, go_on.text
    app.check_idle()


def test_cancelling_ends_the_run_and_frees_its_slot(app: FakeApp) -> None:
    queued = create(app, max_output_tokens=2000, ignore_eos=True)
    deadline = time.monotonic() + POLL_S
    while get(app, queued["id"])["status"] == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    running = app.send("POST", "/v1/responses", headers=auth(), json={
        **BASE, "previous_response_id": queued["id"]})
    assert running.status_code == 400 and "in_progress" in running.json()["error"]["message"]
    other = app.send("POST", f"/v1/responses/{queued['id']}/cancel", headers=auth("kb"))
    assert other.status_code == 404  # another tenant's is no response at all
    r = app.send("POST", f"/v1/responses/{queued['id']}/cancel", headers=auth())
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    assert get(app, queued["id"])["status"] == "cancelled"
    again = app.send("POST", f"/v1/responses/{queued['id']}/cancel", headers=auth())
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    app.check_idle()


def test_deleting_a_running_response_cancels_it(app: FakeApp) -> None:
    queued = create(app, max_output_tokens=2000, ignore_eos=True)
    r = app.send("DELETE", f"/v1/responses/{queued['id']}", headers=auth())
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert app.send("GET", f"/v1/responses/{queued['id']}", headers=auth()).status_code == 404
    app.check_idle()


def test_another_tenant_cannot_see_it(app: FakeApp) -> None:
    queued = create(app, max_output_tokens=4)
    assert app.send("GET", f"/v1/responses/{queued['id']}",
                    headers=auth("kb")).status_code == 404
    until_ended(app, queued["id"])


@pytest.mark.parametrize(("body", "param"), [
    ({"store": False}, "store"),
    ({"stream": True}, "stream"),
    ({"input": [{"role": "user", "content": "x"}, {"type": "compaction_trigger"}]},
     "background"),
    ({"max_output_tokens": -1}, "max_output_tokens"),
])
def test_a_background_response_that_could_not_be_polled_is_a_400(
        app: FakeApp, body: dict[str, Any], param: str) -> None:
    r = app.send("POST", "/v1/responses", headers=auth(),
                 json={**BASE, "background": True, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    app.check_idle()


@pytest.mark.parametrize("flag", [[[1]], ["x"], 1, "true", {"a": 1}])
def test_background_takes_only_a_boolean(app: FakeApp, flag: object) -> None:
    """A truthy non-boolean is a 400 naming ``background``; nothing runs on."""
    r = app.send("POST", "/v1/responses", headers=auth(),
                 json={**BASE, "max_output_tokens": 2, "background": flag})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "background"
    app.check_idle()


def test_without_a_store_background_is_refused() -> None:
    with FakeApp(app_options={"responses_store": "off"}) as plain:
        r = plain.send("POST", "/v1/responses", json={**BASE, "background": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "background"


def test_a_response_whose_server_stopped_reads_failed(app: FakeApp) -> None:
    """A running object whose process is gone (its pid not alive) is ``failed``."""
    queued = create(app, max_output_tokens=2)
    done = until_ended(app, queued["id"])
    store: ResponseStore = app.client.app.state.llamapy.response_store  # type: ignore[attr-defined]
    gone = 2 ** 22 + 12345  # above any pid this machine hands out
    assert gone > int(Path("/proc/sys/kernel/pid_max").read_text()) or not os.path.exists(
        f"/proc/{gone}")
    store.put_response("acme", {**done, "status": "in_progress", OWNER: [gone, "other"]}, [],
                       None)
    found = get(app, done["id"])
    assert found["status"] == "failed" and "stopped" in found["error"]["message"]
    assert OWNER not in found


def test_shutdown_cancels_and_records_what_runs(tmp_path: Path) -> None:
    path = str(tmp_path / "responses.sqlite3")
    with FakeApp(options={"sleep_s": 0.005}, app_options={"responses_store": path}) as served:
        r = served.send("POST", "/v1/responses",
                        json={**BASE, "background": True, "max_output_tokens": 800,
                              "ignore_eos": True})
        assert r.status_code == 200, r.text
        response_id = r.json()["id"]
        time.sleep(0.2)
    store = ResponseStore(path)
    try:
        found = store.get_response("", response_id)
        assert found is not None and found["status"] == "cancelled", found
    finally:
        store.close()
