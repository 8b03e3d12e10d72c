"""Tenants on the real model, through the official clients: two tenant keys and an admin key
(``--api-key-file`` lines ``KEY TENANT [admin]``) on one server.

Reuse never crosses tenants whatever a body says (``cache_scope`` naming the other tenant is a
sub-scope of the caller's own), ``cache_salt`` isolates inside a tenant, a body cannot name a
tenant, ``/slots`` shows a tenant key only its own slots' details and ``/metrics`` is the
admin's, and ``--cache-report coarse`` rounds what both APIs say about reuse to 128 tokens.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from http_helpers import MODEL_ALIAS, wait_slots_free
from live import LiveApp

from llamapy.serve import create_app
from llamapy.serve.tenants import KeyTable
from llamapy.server import Server

KEYS = "ka alpha\nkb beta\nkadmin ops admin\n"
#: A system prompt long enough that reuse is a number worth reporting (~230 tokens).
SYSTEM = ("You are the help desk of Alpha Corporation. Internal note, do not disclose: the "
          "launch code word is periwinkle and the merger closes in March. ") * 6
ASK = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there."}]


def serve(server: Server, **options: object) -> LiveApp:
    return LiveApp(create_app(server, alias=MODEL_ALIAS, api_keys=KeyTable.parse(KEYS),
                              **options))


@pytest.fixture(scope="module")
def live_tenants(server: Server) -> Iterator[LiveApp]:
    with serve(server) as app:
        yield app


def gpt(live: LiveApp, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=120)


def cached(live: LiveApp, key: str, **extra: object) -> int:
    """The cached prompt tokens a greedy 2-token chat of :data:`ASK` reports."""
    done = gpt(live, key).chat.completions.create(
        model=MODEL_ALIAS, messages=ASK, max_tokens=2, temperature=0, extra_body=extra or None)
    assert done.usage is not None and done.usage.prompt_tokens_details is not None
    return done.usage.prompt_tokens_details.cached_tokens or 0


def test_reuse_stays_inside_the_tenant_whatever_the_body_says(live_tenants: LiveApp) -> None:
    cached(live_tenants, "ka", cache_scope="desk")
    assert cached(live_tenants, "ka", cache_scope="desk") > 200  # alpha reuses its own
    assert cached(live_tenants, "kb", cache_scope="desk") == 0  # the same scope name in beta
    assert cached(live_tenants, "kb", cache_scope="alpha/desk") == 0  # naming alpha's scope
    assert cached(live_tenants, "kadmin", cache_scope="desk") == 0  # the admin's own tenant
    wait_slots_free(httpx.Client(base_url=live_tenants.url,
                                 headers={"Authorization": "Bearer kadmin"}))


def test_a_salt_isolates_inside_the_tenant(live_tenants: LiveApp) -> None:
    cached(live_tenants, "ka", cache_scope="salted", cache_salt="s1")
    assert cached(live_tenants, "ka", cache_scope="salted", cache_salt="s1") > 200
    assert cached(live_tenants, "ka", cache_scope="salted", cache_salt="s2") == 0
    assert cached(live_tenants, "ka", cache_scope="salted") == 0


def test_anthropic_client_reuses_only_its_tenants_prompts(live_tenants: LiveApp) -> None:
    def read(key: str) -> int:
        claude = anthropic.Anthropic(base_url=live_tenants.url, api_key=key, max_retries=0,
                                     timeout=120)
        message = claude.messages.create(
            model=MODEL_ALIAS, system=SYSTEM, max_tokens=2, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "Good morning."}])
        return message.usage.cache_read_input_tokens or 0

    read("kb")
    assert read("kb") > 200
    assert read("ka") == 0


def test_a_body_cannot_name_a_tenant(live_tenants: LiveApp) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        cached(live_tenants, "ka", tenant="beta")
    assert "tenant" in str(caught.value)


def test_slots_and_metrics_by_key(live_tenants: LiveApp) -> None:
    cached(live_tenants, "ka", session="alpha-user-7")
    def get(path: str, key: str) -> httpx.Response:
        return httpx.get(live_tenants.url + path, headers={"Authorization": f"Bearer {key}"})

    wait_slots_free(httpx.Client(base_url=live_tenants.url,
                                 headers={"Authorization": "Bearer kadmin"}))
    as_beta, as_alpha, as_admin = (get("/slots", key).json() for key in ("kb", "ka", "kadmin"))
    assert "alpha-user-7" not in str(as_beta) and "alpha" not in str(as_beta)
    assert any(slot.get("other_tenant") for slot in as_beta)
    assert "alpha-user-7" in str(as_alpha)
    assert any(str(slot.get("cache_scope") or "").startswith("alpha") for slot in as_admin)
    assert get("/metrics", "ka").status_code == 403
    assert get("/metrics", "kadmin").status_code == 200


def test_coarse_report_rounds_reuse_to_128_tokens(server: Server) -> None:
    with serve(server, cache_report="coarse") as app:
        cached(app, "ka", cache_scope="coarse")
        shown = cached(app, "ka", cache_scope="coarse")
        response = httpx.post(app.url + "/v1/chat/completions",
                              headers={"Authorization": "Bearer ka"},
                              json={"model": MODEL_ALIAS, "messages": ASK, "max_tokens": 2,
                                    "temperature": 0, "cache_scope": "coarse"}, timeout=120)
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    header = int(response.headers["X-Llamapy-Cache-Tokens"])
    assert shown % 128 == 0 and header % 128 == 0
    assert prompt_tokens - 1 - 127 <= shown <= prompt_tokens  # all but the last, rounded down
    assert response.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == header
