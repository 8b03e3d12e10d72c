"""Tenants in :mod:`llamapy.ray` without a cluster: routing keys scoped by the tenant of the
caller's API key (and by ``cache_salt``), the affinity table and replica stats never crossing
tenants, the ingress asking the deployment's key table, the builder handing it the same keys
as the replicas."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from llamapy.errors import AuthenticationError
from llamapy.ray.affinity import AffinityTable, ReplicaLoad, choose, routing_stats
from llamapy.ray.ingress import LlamapyIngress
from llamapy.ray.keys import RoutingKey, routing_key, scope_id
from llamapy.ray.router import ROUTING_KWARG
from llamapy.ray.tenancy import KeyTenants, offered_keys, tenant_lookup

SYSTEM = "You are the support desk of a company with a long and detailed policy. " * 4
BODY = {"messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": "Where is my order?"}],
        "user": "alice", "cache_scope": "support"}


class Principal(NamedTuple):
    """What the serve layer's key table answers: the key's tenant and role."""

    tenant: str | None
    admin: bool = False


class Keys:
    """A key table in the serve layer's interface (``match(offered) -> principal | None``)."""

    def __init__(self, table: dict[str, Principal]) -> None:
        self.table = table

    def match(self, offered: Sequence[str]) -> Principal | None:
        return next((self.table[key] for key in offered if key in self.table), None)


KEYS = Keys({"key-a": Principal("acme"), "key-b": Principal("globex"),
             "key-d": Principal(None), "key-root": Principal(None, True)})


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# --- keys ---------------------------------------------------------------------------------------


def test_two_tenants_sending_the_same_body_share_no_part_of_their_keys():
    a, b = (routing_key({}, BODY, tenant=t) for t in ("acme", "globex"))
    default = routing_key({}, BODY)
    assert len({a.session, b.session, default.session}) == 3
    assert len({a.scope, b.scope, default.scope}) == 3
    assert not set(a.prefix) & set(b.prefix) and not set(a.prefix) & set(default.prefix)
    assert routing_key({}, BODY, tenant="acme") == a  # and one tenant's keys are stable


def test_a_salt_seeds_the_session_and_prefix_but_not_the_scope():
    plain = routing_key({}, BODY, tenant="acme")
    salted = routing_key({}, {**BODY, "cache_salt": "s1"}, tenant="acme")
    other = routing_key({}, {**BODY, "cache_salt": "s2"}, tenant="acme")
    assert len({plain.session, salted.session, other.session}) == 3
    assert not set(salted.prefix) & (set(plain.prefix) | set(other.prefix))
    assert plain.scope == salted.scope == scope_id("acme", "support")


@given(st.tuples(st.none() | st.text(max_size=8), st.none() | st.text(max_size=8)),
       st.tuples(st.none() | st.text(max_size=8), st.none() | st.text(max_size=8)))
def test_distinct_tenant_and_scope_pairs_have_distinct_scope_ids(x, y):
    assert (scope_id(*x) == scope_id(*y)) == (x == y)


def test_a_scope_or_salt_the_engine_would_refuse_counts_as_absent():
    for bad in ("a\x1fb", "x" * 257, "", 5, ["s"]):
        assert routing_key({}, {**BODY, "cache_scope": bad}) == routing_key(
            {}, {k: v for k, v in BODY.items() if k != "cache_scope"})
        assert routing_key({}, {**BODY, "cache_salt": bad}) == routing_key({}, BODY)


def test_no_scope_and_no_tenant_is_the_shared_pool():
    key = routing_key({}, {"prompt": "x" * 300})
    assert key.scope is None and scope_id(None, None) is None
    assert routing_key({}, {"prompt": "x" * 300}, tenant="acme").scope == scope_id("acme", None)


# --- the table and the stats ----------------------------------------------------------------


def test_affinity_never_crosses_tenants():
    table = AffinityTable()
    table.record(routing_key({}, BODY, tenant="acme"), "r1")
    loads = [ReplicaLoad("r1", 1), ReplicaLoad("r2", 0)]
    assert choose(table, routing_key({}, BODY, tenant="acme"), loads).reason == "session"
    other = choose(table, routing_key({}, BODY, tenant="globex"), loads)
    assert other.reason == "load" and other.ranks[0] == ["r2"]
    # and without its session, globex's same prompt finds no prefix of acme's either
    no_session = {k: v for k, v in BODY.items() if k != "user"}
    assert choose(table, routing_key({}, no_session, tenant="globex"), loads).reason == "load"
    assert choose(table, routing_key({}, no_session, tenant="acme"), loads).reason == "prefix"


def test_replica_stats_name_scopes_by_opaque_ids_that_only_the_tenant_matches():
    stats = {"n_ctx": 1000, "slots": [
        {"cached_tokens": 10, "tenant": "acme", "cache_scope": "secret-project"},
        {"cached_tokens": 10, "tenant": "globex", "cache_scope": "secret-project"},
        {"cached_tokens": 10, "tenant": "acme", "cache_scope": None},
        {"cached_tokens": 10, "tenant": None, "cache_scope": None}]}
    out = routing_stats(stats)
    assert "secret" not in json.dumps(out) and "acme" not in json.dumps(out)
    assert sorted(out["cache_scopes"]) == sorted([scope_id("acme", "secret-project"),
                                                  scope_id("globex", "secret-project"),
                                                  scope_id("acme", None)])
    holder = ReplicaLoad("r1", 0, frozenset([scope_id("acme", "secret-project")]))
    loads = [holder, ReplicaLoad("r2", 0)]
    mine = {"prompt": "short", "cache_scope": "secret-project"}
    assert choose(AffinityTable(), routing_key({}, mine, tenant="acme"), loads).reason == "scope"
    assert choose(AffinityTable(), routing_key({}, mine, tenant="globex"),
                  loads).reason == "load"


# --- the tenant of a request ----------------------------------------------------------------


def test_the_tenant_is_the_key_tables_for_either_header():
    tenant_of = KeyTenants(KEYS)
    assert tenant_of(bearer("key-a")) == "acme"
    assert tenant_of({"x-api-key": "key-b"}) == "globex"
    assert tenant_of(bearer("key-root")) is None and tenant_of(bearer("key-d")) is None
    for headers in ({}, bearer("nope"), {"authorization": "Basic key-a"}):
        with pytest.raises(AuthenticationError):
            tenant_of(headers)
    assert offered_keys({"authorization": "bearer k1", "x-api-key": " k2 "}) == ["k1", "k2"]


def test_the_lookup_is_the_replicas_key_table_or_none():
    assert isinstance(tenant_lookup({"api_keys": KEYS}), KeyTenants)
    plain = tenant_lookup({"api_key": "k1,k2"})  # one tenant: keys without tenants
    assert plain is not None and plain(bearer("k2")) is None and tenant_lookup({}) is None
    with pytest.raises(AuthenticationError):
        plain(bearer("k3"))


class FakeHandle:
    """The model deployment's handle: records each call's routing key, answers 200."""

    def __init__(self) -> None:
        self.keys: list[RoutingKey] = []

    def options(self, **_: Any) -> FakeHandle:
        return self

    def remote(self, forwarded: Any, **kwargs: Any) -> Any:
        self.keys.append(kwargs[ROUTING_KWARG])
        return FakeStream()


class FakeStream:
    def __init__(self) -> None:
        self.messages = [{"type": "http.response.start", "status": 200, "headers": []},
                         {"type": "http.response.body", "body": b"{}", "more_body": False}]

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if not self.messages:
            raise StopAsyncIteration
        return self.messages.pop(0)

    def cancel(self) -> None:
        self.messages.clear()


def test_the_ingress_keys_each_request_by_its_callers_tenant():
    handle = FakeHandle()
    ingress = LlamapyIngress(handle, tenant_of=KeyTenants(KEYS))  # type: ignore[arg-type]

    async def endpoint(request: Request) -> Response:
        return await ingress(request)

    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])
    with TestClient(app, base_url="http://localhost") as client:
        for key in ("key-a", "key-b"):
            r = client.post("/v1/chat/completions", json=BODY, headers=bearer(key))
            assert r.status_code == 200
        refused = client.post("/v1/chat/completions", json=BODY, headers=bearer("nope"))
        assert refused.status_code == 401  # at the ingress, its body unread
        assert client.get("/health").status_code == 200
    acme, globex, anonymous = handle.keys
    assert acme == routing_key({}, BODY, tenant="acme")
    assert globex == routing_key({}, BODY, tenant="globex")
    assert anonymous == RoutingKey() and anonymous.empty  # routed by load, recorded nowhere


def test_the_builder_gives_the_ingress_the_replicas_keys(tmp_path: Path):
    from llamapy.ray.builder import build_app

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    app = build_app(model, app_options={"api_keys": KEYS})
    ingress_kwargs = app._bound_deployment.init_kwargs
    assert ingress_kwargs["tenant_of"] == KeyTenants(KEYS)
    replica_args = app._bound_deployment.init_args[0]._bound_deployment.init_args
    assert replica_args[2]["api_keys"] is KEYS
    assert build_app(model)._bound_deployment.init_kwargs["tenant_of"] is None


def test_the_serve_layers_key_table_names_the_tenant() -> None:
    """The table ``python -m llamapy.serve --api-key-file`` builds is the one the ingress
    asks: its tenants route, a key it lacks is refused, a default-tenant key is None."""
    from llamapy.serve.tenants import KeyTable

    table = KeyTable.parse("key-a acme\nkey-d\nkey-root - admin\n", source="keys")
    tenant_of = tenant_lookup({"api_keys": table})
    assert tenant_of is not None
    assert tenant_of(bearer("key-a")) == "acme"
    assert tenant_of({"x-api-key": "key-d"}) is None
    assert tenant_of(bearer("key-root")) is None
    with pytest.raises(AuthenticationError):
        tenant_of(bearer("key-x"))
