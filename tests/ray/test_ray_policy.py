"""The affinity policy of :mod:`llamapy.ray` without a cluster: routing keys, the LRU table,
``choose``, the routing stats summary, the deployment options, the in-process ASGI relay and
the ``serve run`` builder's argument parsing."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from llamapy.errors import InvalidOptionError, UnknownOptionError, UnsupportedFeatureError
from llamapy.options import DEPLOYMENT_DEFAULTS, DeploymentOptions
from llamapy.ray.affinity import (
    AffinityTable,
    LoadBook,
    ReplicaLoad,
    choose,
    engine_load,
    routing_stats,
)
from llamapy.ray.forward import ForwardedRequest, run_asgi
from llamapy.ray.keys import RoutingKey, prefix_hashes, prompt_text, routing_key, scope_id

SYSTEM = "You are a terse assistant for the ACME support desk. " * 6


def chat(*turns: str, **fields: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": text}
                 for i, text in enumerate(turns)]
    return {"messages": messages, **fields}


# --- keys ---------------------------------------------------------------------------------------


def session_of(name: str) -> str | None:
    return routing_key({}, {"session": name}).session


def test_the_session_header_beats_the_body_fields_which_go_in_order():
    body = {"session": "s", "prompt_cache_key": "p", "user": "u"}
    assert routing_key({"x-session-id": "h"}, body).session == session_of("h")
    assert routing_key({}, body).session == session_of("s")
    assert routing_key({}, {"prompt_cache_key": "p", "user": "u"}).session == session_of("p")
    assert routing_key({}, {"user": "u"}).session == session_of("u")
    assert routing_key({}, {"metadata": {"user_id": "a"}}).session == session_of("a")
    assert routing_key({}, {"user": ""}).session is None
    assert len({session_of(name) for name in "hspua"}) == 5


def test_a_session_belongs_to_its_cache_scope():
    a = routing_key({}, {"user": "u", "cache_scope": "tenant-a"})
    b = routing_key({}, {"user": "u", "cache_scope": "tenant-b"})
    assert a.scope == scope_id(None, "tenant-a") != b.scope and a.session != b.session


def test_a_later_turn_extends_the_prefix_hashes_of_the_earlier_one():
    first = routing_key({}, chat("How do I reset my password? " * 4))
    second = routing_key({}, chat("How do I reset my password? " * 4, "Click 'forgot'.",
                                  "And then?"))
    assert len(first.prefix) >= 3
    assert second.prefix[:len(first.prefix)] == first.prefix
    other = routing_key({}, chat("Where is my invoice? " * 4))
    shared = sum(1 for x, y in zip(first.prefix, other.prefix, strict=False) if x == y)
    assert 0 < shared < len(first.prefix)  # the system prompt's blocks only


def test_the_scope_seeds_the_prefix_hashes():
    text = "x" * 1000
    assert not set(prefix_hashes(text, "a")) & set(prefix_hashes(text, "b"))
    assert prefix_hashes(text, None) == prefix_hashes(text, None)


@given(st.text(max_size=600), st.text(max_size=600), st.text(max_size=600))
def test_hashes_are_shared_exactly_over_the_shared_full_blocks(common, tail_a, tail_b):
    a, b = common + tail_a, common + tail_b
    shared_chars = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                        min(len(a), len(b)))
    ha, hb = prefix_hashes(a, None, block_chars=16), prefix_hashes(b, None, block_chars=16)
    same = next((i for i, (x, y) in enumerate(zip(ha, hb, strict=False)) if x != y),
                min(len(ha), len(hb)))
    assert same == min(shared_chars // 16, len(ha), len(hb))
    assert len(ha) == len(a) // 16


def test_only_full_blocks_up_to_max_blocks_are_hashed():
    assert prefix_hashes("y" * 127, None) == ()
    assert len(prefix_hashes("y" * 128, None)) == 1
    assert len(prefix_hashes("y" * 10_000, None, block_chars=10, max_blocks=7)) == 7


def test_the_prompt_text_of_each_api():
    anthropic = prompt_text({"system": "be brief", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    assert "be brief" in anthropic and "hi" in anthropic
    assert anthropic.index("be brief") < anthropic.index("hi")
    responses = prompt_text({"instructions": "sys", "input": "question"})
    assert responses.index("sys") < responses.index("question")
    assert prompt_text({"prompt": "raw text"}) == "raw text"
    assert prompt_text({"prompt": [1, 2, 3]}) == "<1><2><3>"
    assert routing_key({}, ["not", "an", "object"]) == RoutingKey()
    assert RoutingKey().empty and not routing_key({}, {"user": "u"}).empty


# --- the table and the choice -------------------------------------------------------------------


def key_of(session: str | None = None, prefix: tuple[str, ...] = (),
           scope: str | None = None) -> RoutingKey:
    return RoutingKey(session=session, scope=scope, prefix=prefix)


def loads(**by_replica: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(name, load) for name, load in by_replica.items()]


def test_the_session_comes_before_the_longest_prefix_which_comes_before_shorter_ones():
    table = AffinityTable()
    table.record(key_of(prefix=("p1",)), "a")
    table.record(key_of(prefix=("p1", "p2")), "b")
    assert table.holder(key_of(prefix=("p1", "p2", "p3")), {"a", "b"}) == ("b", "prefix")
    assert table.holder(key_of(prefix=("p1", "x")), {"a", "b"}) == ("b", "prefix")
    table.record(key_of(session="s"), "a")
    assert table.holder(key_of("s", ("p1", "p2")), {"a", "b"}) == ("a", "session")
    assert table.holder(key_of("s", ("p1", "p2")), {"b"}) == ("b", "prefix")  # a is gone


def test_the_maps_stay_within_their_bound_and_forget_a_dead_replica():
    table = AffinityTable(max_entries=5)
    for i in range(20):
        table.record(key_of(f"s{i}", (f"p{i}",)), "ab"[i % 2])
        table.check_integrity()
    assert len(table) == 10
    assert table.holder(key_of("s19"), {"a", "b"}) == ("b", "session")
    assert table.holder(key_of("s0"), {"a", "b"}) == (None, "")  # evicted
    table.forget("b")
    table.check_integrity()
    assert table.replicas() == {"a"}


def test_a_holder_within_the_bound_is_ranked_first_alone():
    table = AffinityTable()
    table.record(key_of("s"), "a")
    choice = choose(table, key_of("s"), loads(a=5, b=1), max_imbalance=4)
    assert choice.ranks == [["a"], ["b"]] and choice.reason == "session"


def test_an_overloaded_holder_yields_to_the_least_loaded():
    table = AffinityTable()
    table.record(key_of("s"), "a")
    choice = choose(table, key_of("s"), loads(a=6, b=1, c=3), max_imbalance=4)
    assert choice.ranks == [["b"], ["c", "a"]] and choice.reason == "overloaded"


def test_the_load_book_counts_chosen_requests_until_they_expire_or_complete():
    book = LoadBook(ttl_s=10)
    book.chosen("r1", "a", now=0)
    book.chosen("r2", "a", now=0)
    book.chosen("r2", "b", now=1)  # a retry chose again
    assert book.counts(now=2) == {"a": 1, "b": 1}
    book.routed("r1", "a")
    assert book.counts(now=20) == {"a": 1}  # r2 was never sent: expired
    book.chosen("r1", "b", now=20)  # already running: stays where it runs
    assert book.counts(now=21) == {"a": 1}
    book.completed("r1")
    book.chosen("r3", "b", now=21)
    book.drop("b")
    assert book.counts(now=22) == {}


def test_a_new_session_follows_a_prefix_holder_only_among_the_least_loaded():
    table = AffinityTable()
    table.record(key_of("old", ("sys",)), "a")
    busy = choose(table, key_of("new", ("sys", "q")), loads(a=1, b=0))
    assert busy.ranks[0] == ["b"]
    idle = choose(table, key_of("new", ("sys", "q")), loads(a=0, b=0))
    assert idle.ranks[0] == ["a"] and idle.reason == "prefix"
    keyless = choose(table, key_of(None, ("sys", "q")), loads(a=2, b=0))
    assert keyless.ranks[0] == ["a"]  # no session: the prefix, within the bound


def test_the_scope_in_a_replicas_stats_holds_a_request_nothing_else_holds():
    replicas = [ReplicaLoad("a", 0), ReplicaLoad("b", 1, frozenset({"t"}))]
    choice = choose(AffinityTable(), key_of(scope="t", prefix=("z",)), replicas)
    assert choice.ranks[0] == ["b"] and choice.reason == "scope"


def test_without_a_holder_the_least_loaded_come_first():
    firsts = set()
    for seed in range(20):
        choice = choose(AffinityTable(), RoutingKey(), loads(a=2, b=0, c=0, d=1),
                        rng=random.Random(seed))
        firsts.add(choice.ranks[0][0])
        assert len(choice.ranks[0]) == 1 and choice.ranks[1][-2:] == ["d", "a"]
    assert firsts == {"b", "c"}  # the least loaded, at random
    assert choose(AffinityTable(), RoutingKey(), []).ranks == []


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 9), st.sampled_from("st"),
                          st.lists(st.sampled_from(["p", "q", "r"]), max_size=3)),
                min_size=1, max_size=40),
       st.integers(0, 3))
def test_every_choice_ranks_each_candidate_once_and_respects_the_bound(steps, bound):
    table = AffinityTable(max_entries=4)
    for replica, load, session, prefix in steps:
        key = key_of(session, tuple(prefix))
        candidates = [ReplicaLoad(r, (load * (i + 1)) % 7) for i, r in enumerate("abc")]
        holder, _ = table.holder(key, {"a", "b", "c"})
        choice = choose(table, key, candidates, max_imbalance=bound)
        flat = [r for rank in choice.ranks for r in rank]
        assert sorted(flat) == ["a", "b", "c"]
        least = min(c.load for c in candidates)
        by_id = {c.replica: c.load for c in candidates}
        assert by_id[choice.ranks[0][0]] - least <= bound
        if holder is not None and by_id[holder] - least > bound:
            assert holder not in choice.ranks[0]
        table.record(key, replica)
        table.check_integrity()


def test_routing_stats_summarize_the_servers_stats():
    stats = {"queue_depth": 3, "slots_active": 2, "n_parallel": 2, "n_ctx": 1000,
             "ram_cache_entries": 1, "slots": [
                 {"cached_tokens": 300, "cache_scope": "t"},
                 {"cached_tokens": 100, "cache_scope": None},
                 {"cached_tokens": 0, "cache_scope": "gone"}]}
    out = routing_stats(stats)
    assert out["queue_depth"] == 3 and out["slots_active"] == 2
    assert out["kv_used"] == pytest.approx(0.4)
    assert out["cached_slots"] == 2 and out["cached_tokens"] == 400
    assert out["cache_scopes"] == [scope_id(None, "t")]
    assert engine_load(out) == 5 and engine_load({}) == 0
    assert routing_stats({"state": "loading"})["kv_used"] == 0.0


# --- options ------------------------------------------------------------------------------------


def test_deployment_options_parse_strings_by_type_and_refuse_bad_ones():
    options = DeploymentOptions.from_strings({"replicas": "3", "stats_period_s": "0.5",
                                              "router": "default"})
    assert (options.replicas, options.stats_period_s, options.router) == (3, 0.5, "default")
    assert DEPLOYMENT_DEFAULTS.router == "affinity"
    with pytest.raises(UnknownOptionError):
        DeploymentOptions.from_strings({"replica": "3"})
    with pytest.raises(InvalidOptionError):
        DeploymentOptions.from_strings({"replicas": "many"})
    with pytest.raises(InvalidOptionError):
        DeploymentOptions(router="random")
    with pytest.raises(InvalidOptionError):
        DeploymentOptions(replicas=0)


# --- the ASGI relay -----------------------------------------------------------------------------


def relay_app(seen: list[str]) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"body": (await request.body()).decode(), "path": request.url.path,
                             "q": request.query_params.get("q")})

    async def stream(request: Request) -> StreamingResponse:
        async def chunks() -> Any:
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(0.01)
            finally:
                seen.append("stream closed")
        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/stream", stream)])


def forwarded(path: str, body: bytes = b"", method: str = "POST",
              query: bytes = b"") -> ForwardedRequest:
    return ForwardedRequest(method=method, path=path, query_string=query,
                            headers=((b"content-type", b"application/json"),), body=body)


async def test_run_asgi_relays_the_response_with_the_extra_header():
    messages = [m async for m in run_asgi(relay_app([]), forwarded("/echo", b"hello",
                                                                   query=b"q=1"),
                                          ((b"x-llamapy-replica", b"r1"),))]
    assert messages[0]["status"] == 200
    assert (b"x-llamapy-replica", b"r1") in [tuple(h) for h in messages[0]["headers"]]
    assert b'"body":"hello"' in messages[1]["body"] and b'"q":"1"' in messages[1]["body"]


async def test_closing_the_relay_early_disconnects_the_app():
    seen: list[str] = []
    relay = run_asgi(relay_app(seen), forwarded("/stream", method="GET"))
    start = await relay.__anext__()
    first = await relay.__anext__()
    assert start["status"] == 200 and first["body"] == b"data: 0\n\n"
    await relay.aclose()
    assert seen == ["stream closed"]


# --- the builder --------------------------------------------------------------------------------


def test_serve_run_arguments_become_options_and_bad_ones_fail_before_any_replica(
        tmp_path: Path):
    from llamapy.ray.builder import _parse_flags, app, build_app

    flags = _parse_flags({"n_ctx": "1024", "metrics": "false", "api_key": "k"})
    assert (flags.n_ctx, flags.metrics, flags.api_key) == (1024, False, "k")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    assert app({"model": str(model), "replicas": "3", "n_threads": "1"}) is not None
    with pytest.raises(UnknownOptionError):
        build_app(model, n_context=5)
    with pytest.raises(InvalidOptionError):
        app({"model": str(model), "replicas": "0"})
    with pytest.raises(InvalidOptionError):
        app({"model": str(model), "models_dir": str(tmp_path)})
    with pytest.raises(UnsupportedFeatureError, match="continuous"):
        app({"model": str(model), "cont_batching": "false"})


def test_a_lost_replica_is_a_503_in_each_apis_shape() -> None:
    import orjson

    from llamapy.errors import ReplicaUnavailableError
    from llamapy.ray.ingress import _error_response, _stream_error

    lost = ReplicaUnavailableError("gone", replica="r1")
    openai = _error_response("/v1/chat/completions", lost)
    assert openai.status_code == 503 and openai.headers["retry-after"]
    assert orjson.loads(openai.body)["error"]["code"] == "replica_unavailable"
    anthropic = _error_response("/v1/messages", lost)
    assert anthropic.status_code == 503
    assert orjson.loads(anthropic.body)["type"] == "error"
    assert _stream_error("/v1/messages", lost).startswith(b"event: error\ndata: {")
    event = _stream_error("/v1/chat/completions", lost)
    assert orjson.loads(event.removeprefix(b"data: "))["error"]["code"] == "replica_unavailable"
