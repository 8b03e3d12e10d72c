"""``cache_salt`` (vLLM's field) over every generation route, on the fake backend.

A salt isolates a request's reuse inside its tenant and scope: two requests with the same
prompt and different salts reuse nothing of each other, the same salt reuses, and a request
without a salt reuses nothing a salted one left (nor the other way round). A salt that is not
a printable string of 1 to 256 characters is a 400 naming ``cache_salt``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_http import FakeApp, fake_app

from llamapy.engine.fake.text import FakeTextModel

PROMPT = "A prompt long enough for its prefix to be worth reusing, twice over. " * 3

Body = Callable[[str], dict[str, Any]]
#: Each route as ``(path, body of a prompt text)``.
ROUTES: dict[str, tuple[str, Body]] = {
    "chat": ("/v1/chat/completions", lambda text: {
        "messages": [{"role": "user", "content": text}], "max_tokens": 2}),
    "completions": ("/v1/completions", lambda text: {"prompt": text, "max_tokens": 2}),
    "native": ("/completion", lambda text: {"prompt": text, "n_predict": 2}),
    "messages": ("/v1/messages", lambda text: {
        "model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": text}]}),
    "responses": ("/v1/responses", lambda text: {"input": text, "max_output_tokens": 2}),
    "infill": ("/infill", lambda text: {"input_prefix": text, "input_suffix": "end",
                                        "n_predict": 2}),
}

_scopes = itertools.count()


class FimModel(FakeTextModel):
    """The fake model with fill-in-the-middle tokens (three of its words), so ``/infill``
    serves."""

    @property
    def fim_tokens(self) -> dict[str, int]:
        """Prefix, suffix and middle tokens; no others."""
        return {"pre": 1, "suf": 2, "mid": 3, "pad": -1, "rep": -1, "sep": -1}


@pytest.fixture(scope="module")
def salted() -> Iterator[FakeApp]:
    """The fake app on a model with FIM tokens, with a slot for each of a test's three keys
    (salts alice and bob, no salt)."""
    with fake_app(options={"model": FimModel(), "n_parallel": 3}) as app:
        yield app


def reused(app: FakeApp, route: str, scope: str, salt: str | None) -> int:
    """The prompt tokens ``route`` reports reused for :data:`PROMPT` with ``salt``."""
    path, body = ROUTES[route]
    extra = {"cache_scope": scope} if salt is None else {"cache_scope": scope, "cache_salt": salt}
    r = app.send("POST", path, json={**body(PROMPT), **extra})
    assert r.status_code == 200, r.text
    return int(r.headers["x-llamapy-cache-tokens"])


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_salt_shares_kv_only_with_the_same_salt(salted: FakeApp, route: str):
    scope = f"salt-{next(_scopes)}"
    assert reused(salted, route, scope, "alice") == 0
    assert reused(salted, route, scope, "bob") == 0  # the same prompt, another salt
    assert reused(salted, route, scope, None) == 0  # no salt: not the salted KV either
    assert reused(salted, route, scope, "alice") > 0  # the same salt reuses
    assert reused(salted, route, scope, None) > 0  # and so does no salt, its own
    salted.check_idle()


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("salt", [5, "", "x" * 257, "tab\there", ["a"]],
                         ids=["number", "empty", "too-long", "unprintable", "list"])
def test_a_malformed_salt_is_a_400_naming_it(salted: FakeApp, route: str, salt: Any):
    path, body = ROUTES[route]
    r = salted.send("POST", path, json={**body("hi"), "cache_salt": salt})
    assert r.status_code == 400, r.text
    assert "cache_salt" in r.text
    error = r.json()["error"]
    if route != "messages":  # Anthropic's error shape has no param
        assert error["param"] == "cache_salt"
