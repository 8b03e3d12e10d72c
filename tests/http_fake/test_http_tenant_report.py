"""``--cache-report coarse|off`` with tenant keys: a key that is not an admin's sees no token
counts of any slot, its own included, and a feed without token counters (read before and after
one request, they would tell its reuse exactly); an admin sees everything."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_http import FakeApp, fake_app

from llamapy.serve.pages.tenant_view import BARE_FIELDS, COUNTED_TOKENS, feed_view
from llamapy.serve.tenants import KeyTable, Principal

KEYS = "ka acme\nkadm ops admin\n"


@pytest.fixture(scope="module", params=["coarse", "off"])
def coarse(request: pytest.FixtureRequest) -> Iterator[FakeApp]:
    with fake_app(app_options={"api_keys": KeyTable.parse(KEYS),
                               "cache_report": request.param}) as app:
        yield app


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_tenant_sees_even_its_own_slots_bare(coarse: FakeApp) -> None:
    response = coarse.send("POST", "/v1/completions", headers=auth("ka"),
                           json={"prompt": "hi there", "max_tokens": 2, "cache_scope": "s"})
    assert response.status_code == 200, response.text
    coarse.check_idle()
    own = [s for s in coarse.send("GET", "/slots", headers=auth("ka")).json()
           if s.get("other_tenant") is False]
    assert own and all(set(s) == {*BARE_FIELDS, "other_tenant"} for s in own)
    admin = coarse.send("GET", "/slots", headers=auth("kadm")).json()
    assert any(s.get("cached_tokens") for s in admin)
    assert any(s.get("cache_scope") == "acme/s" for s in admin)


def test_a_tenant_feed_has_no_token_counters_unless_exact() -> None:
    own = {"tokens": {"prompt": 5}, "reused": {"own": 2}, "requests": {"finished": 1}}
    frame = {"slots": [], "tokens": {"prompt": 7}, "reused": {"own": 3},
             "ram_cache": {"bytes": 1}, "disk_cache": {"bytes": 1}, "requests": {"finished": 2},
             "by_tenant": {"acme": own}}
    tenant, admin = Principal("acme", False), Principal("ops", True)
    hidden = feed_view(frame, tenant, exact=False)
    assert not set(COUNTED_TOKENS) & set(hidden) and hidden["requests"] == {"finished": 1}
    assert feed_view(frame, tenant, exact=True)["tokens"] == {"prompt": 5}  # its own alone
    assert feed_view(frame, admin, exact=False)["reused"] == {"own": 3}
