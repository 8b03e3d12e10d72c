"""The events feed (and so the dashboard) as a tenant key sees it, in every ``--cache-report``
mode: its own tenant's requests counted, never the server's totals (another tenant's request
moves nothing it sees); an admin sees the totals and each tenant's counters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fake_http import FakeApp, fake_app, feed_frame

from llamapy.serve.pages.tenant_view import SERVER_SECTIONS, feed_view
from llamapy.serve.tenants import KeyTable, Principal

KEYS = "ka acme\nkb beta\nkadm ops admin\nkdef\n"
#: Another tenant's request: a long prompt and a few generated tokens.
BETA_PROMPT = " ".join(f"w{i}" for i in range(150))
#: What differs between two frames whatever the requests: the clock, the viewers, the slots
#: (their states; another tenant's are bare).
VOLATILE = ("time", "watchers", "slots")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module", params=["exact", "coarse", "off"])
def app(request: pytest.FixtureRequest) -> Iterator[FakeApp]:
    with fake_app(app_options={"api_keys": KeyTable.parse(KEYS),
                               "cache_report": request.param}) as served:
        yield served


def steady(frame: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in frame.items() if k not in VOLATILE}


def complete(app: FakeApp, key: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    r = app.send("POST", "/v1/completions", headers=auth(key),
                 json={"prompt": prompt, "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    app.check_idle()
    return dict(r.json()["usage"])


def test_another_tenants_request_moves_nothing_a_tenant_sees(app: FakeApp) -> None:
    before = {key: steady(feed_frame(app, key)) for key in ("ka", "kdef")}
    usage = complete(app, "kb", BETA_PROMPT, 3)
    assert usage["prompt_tokens"] > 100
    for key, frame in before.items():
        after = feed_frame(app, key)
        assert steady(after) == frame, key
        assert after["view"] == "tenant" and not set(SERVER_SECTIONS) & set(after)
        assert "tenants" not in after and "by_tenant" not in after


def test_a_tenant_counts_its_own_requests(app: FakeApp) -> None:
    start = feed_frame(app, "ka")
    usage = complete(app, "ka", "hello there", 2)
    complete(app, "kb", BETA_PROMPT, 3)
    now = feed_frame(app, "ka")
    assert now["requests"]["finished"] - start["requests"]["finished"] == 1
    assert now["requests"]["submitted"] - start["requests"]["submitted"] == 1
    assert now["queue_depth"] == 0 and now["ttft"]["count"] - start["ttft"]["count"] == 1
    exact = now["cache_report"] == "exact"
    assert ("tokens" in now) == ("reused" in now) == exact
    if exact:
        assert now["tokens"]["prompt"] - start["tokens"]["prompt"] == usage["prompt_tokens"]
        assert now["tokens"]["generated"] - start["tokens"]["generated"] == 2


def test_an_admin_sees_the_totals_and_each_tenant(app: FakeApp) -> None:
    complete(app, "ka", "hello again", 2)
    complete(app, "kb", BETA_PROMPT, 3)
    admin = feed_frame(app, "kadm")
    assert set(SERVER_SECTIONS) <= set(admin) and "view" not in admin
    tenants = {row["tenant"]: row for row in admin["tenants"]}
    assert {"acme", "beta"} <= set(tenants)
    assert admin["requests"]["finished"] == sum(t["requests"]["finished"]
                                                for t in tenants.values())
    assert admin["tokens"]["prompt"] == sum(t["tokens"]["prompt"] for t in tenants.values())


def test_a_tenant_without_requests_sees_zeros_in_the_totals_shape() -> None:
    frame = {"slots": [], "tokens": {"prompt": 157, "generated": 3},
             "requests": {"finished": 4}, "reused": {"own": 9}, "ttft": {"sum_s": 1.5,
                                                                         "count": 4},
             "queue_depth": 2, "ram_cache": {"bytes": 1}, "events": {"instability": 1},
             "by_tenant": {"beta": {"tokens": {"prompt": 157, "generated": 3}}}}
    view = feed_view(frame, Principal("acme", False))
    assert view["tokens"] == {"prompt": 0, "generated": 0} and view["queue_depth"] == 0
    assert view["requests"] == {"finished": 0} and view["ttft"] == {"sum_s": 0, "count": 0}
    assert "157" not in json.dumps(view)
