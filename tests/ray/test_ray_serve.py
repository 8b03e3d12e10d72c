"""``llamapy.ray`` on a real (loopback) Ray Serve cluster: two applications of 2 replicas each
(1 llama.cpp thread, small context, SmolLM2), one with the affinity router and one with Ray's
default router, behind one HTTP proxy on 127.0.0.1.

The module starts one Ray cluster (2 CPUs, no dashboard) for all its tests; the replica-kill
test runs last and leaves the affinity app replaced but serving.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from ray import serve
from ray_workload import REPLICA_HEADER, Turn, first_visits, run_workload, summary

import llamapy
from llamapy.models import default_model_path
from llamapy.options import DeploymentOptions
from llamapy.ray import build_app
from llamapy.ray.keys import scope_id

ROOT = Path(llamapy.__file__).resolve().parents[1]
MODEL = "smol"
#: Per replica: 4 slots sharing 2048 cells, a small RAM prompt cache, one thread (two replicas
#: share the 2 cores).
START = {"n_ctx": 2048, "n_parallel": 4, "n_batch": 256, "chunk_size": 256, "n_threads": 1,
         "max_queue": 32, "prompt_cache_ram_mb": 64}
APPS = ("affinity", "default")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def proxy() -> Iterator[str]:
    """A 2-CPU local Ray cluster whose workers import this checkout's llamapy; Serve's proxy
    on a free loopback port."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20,
             runtime_env={"env_vars": {"PYTHONPATH": path}}, logging_level="ERROR",
             log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def apps(proxy: str) -> dict[str, str]:
    """The two applications, each at ``/<router>``."""
    for router in APPS:
        options = DeploymentOptions(router=router, replica_cpus=0, stats_period_s=0.5)
        serve.run(build_app(default_model_path(), deployment=options,
                            app_options={"alias": MODEL}, **START),
                  name=router, route_prefix=f"/{router}")
    return {router: f"{proxy}/{router}" for router in APPS}


@pytest.fixture(scope="module")
def http(apps: dict[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=apps["affinity"], timeout=120) as client:
        yield client


def chat(content: str = "Say hi.", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 4, "temperature": 0, **fields}


def test_replicas_import_this_checkout(apps: dict[str, str]) -> None:
    @ray.remote(num_cpus=0)
    def where() -> str:
        import llamapy as imported

        return str(Path(imported.__file__).resolve())

    assert ray.get(where.remote()) == str(Path(llamapy.__file__).resolve())


def test_every_api_is_served_by_the_replicas(http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    openai = http.post("/v1/chat/completions", json=chat())
    assert openai.status_code == 200 and openai.headers[REPLICA_HEADER]
    assert openai.json()["choices"][0]["message"]["role"] == "assistant"
    anthropic = http.post("/v1/messages", json=chat())
    assert anthropic.status_code == 200 and anthropic.json()["type"] == "message"
    responses = http.post("/v1/responses", json={"model": MODEL, "input": "Say hi.",
                                                 "max_output_tokens": 4})
    assert responses.status_code == 200 and responses.json()["object"] == "response"
    native = http.post("/completion", json={"prompt": "Hello", "n_predict": 3})
    assert native.status_code == 200 and "content" in native.json()
    assert http.get("/v1/models").json()["data"][0]["id"] == MODEL


def test_a_stream_is_relayed_chunk_by_chunk(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/chat/completions",
                     json=chat(stream=True, max_tokens=8)) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 4


def test_errors_keep_each_apis_shape(http: httpx.Client) -> None:
    bad = http.post("/v1/chat/completions", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    anthropic = http.post("/v1/messages", json={**chat(), "model": "other"})
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error"
    assert http.get("/no/such/path").status_code == 404


def test_replicas_report_their_load_and_cache_through_the_routing_stats_hook(
        http: httpx.Client) -> None:
    served = http.post("/v1/chat/completions",
                       json=chat("Tell me a fact.", cache_scope="tenant-x", user="stats"))
    replica = served.headers[REPLICA_HEADER]
    mine = stats_of(replica)
    assert scope_id(None, "tenant-x") in mine["cache_scopes"] and mine["cached_tokens"] > 0
    assert 0 < mine["kv_used"] <= 1 and mine["n_parallel"] == 4
    assert {"queue_depth", "slots_active", "cached_slots"} <= set(mine)


@pytest.fixture(scope="module")
def workloads(apps: dict[str, str]) -> dict[str, list[Turn]]:
    """The workload's turns on each router: 8 conversations x 4 turns sharing a system
    prompt, 4 at a time, sessions named by the ``user`` field or the ``x-session-id`` header."""
    return {router: run_workload(apps[router]) for router in APPS}


@pytest.fixture(scope="module")
def figures(workloads: dict[str, list[Turn]]) -> dict[str, dict[str, float]]:
    out = {router: summary(turns) for router, turns in workloads.items()}
    print(f"\n{json.dumps(out, indent=1)}")
    return out


def test_affinity_keeps_each_conversation_on_its_replica(
        figures: dict[str, dict[str, float]]) -> None:
    assert figures["affinity"]["same_replica_share"] >= 0.95
    assert figures["affinity"]["replicas"] == 2  # and still uses both replicas


def test_the_default_router_moves_conversations_about_half_the_time(
        figures: dict[str, dict[str, float]]) -> None:
    # >= 22 of the 24 later turns on the previous turn's replica by chance: p < 2e-5
    assert figures["default"]["same_replica_share"] < 0.9
    assert figures["default"]["replicas"] == 2


def test_affinity_reads_most_of_each_prompt_from_the_cache(
        figures: dict[str, dict[str, float]]) -> None:
    # Each later turn's new question is ~1/5 of its prompt: ~0.8 is all that can be reused.
    assert figures["affinity"]["cached_token_share"] > 0.65


def test_a_turn_moved_to_a_replica_new_to_its_conversation_reuses_only_the_shared_prefix(
        workloads: dict[str, list[Turn]]) -> None:
    # What the default router costs, per moved turn rather than as a share of all turns (how
    # often it moves is chance): the replica holds the system prompt other conversations
    # share (what a first turn reuses at most) and none of this conversation's history.
    turns = workloads["default"]
    shared = max(t.cached_tokens for t in turns if t.turn == 0)
    moved = first_visits(turns)
    assert moved and all(t.cached_tokens <= shared for t in moved), (shared, moved)
    kept = [t for t in workloads["affinity"] if t.turn > 0]
    assert min(t.cached_tokens for t in kept) > shared, (shared, kept)


def test_without_session_keys_the_longest_prefix_keeps_conversations_together(
        apps: dict[str, str]) -> None:
    figures = summary(run_workload(apps["affinity"], conversations=4, turns=3,
                                   sessions=("none",), first=100))
    assert figures["same_replica_share"] >= 0.95


def stats_of(replica: str) -> dict[str, Any]:
    """The routing stats of one replica, asked of its actor as Serve's routers ask it (a call
    through a handle lands on the least-loaded replica, never on a busy one)."""
    actor = ray.get_actor(f"SERVE_REPLICA::affinity#llamapy-model#{replica}", namespace="serve")
    report = ray.get(actor.record_routing_stats.remote(), timeout=30)
    assert report["replica"] == replica
    return dict(report)


def test_a_client_that_leaves_mid_stream_frees_its_slot_on_the_replica(
        http: httpx.Client) -> None:
    with http.stream("POST", "/v1/chat/completions", headers={"x-session-id": "leaver"},
                     json=chat("Count to a thousand.", max_tokens=1000, ignore_eos=True,
                               stream=True)) as stream:
        replica = stream.headers[REPLICA_HEADER]
        lines = stream.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
        assert stats_of(replica)["slots_active"] == 1
    deadline = time.monotonic() + 20
    while stats_of(replica)["slots_active"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stats_of(replica)["slots_active"] == 0


# --- a replica killed mid-run (last: it changes the affinity app's replicas) ---------------------


def pinned_sessions(http: httpx.Client) -> dict[str, str]:
    """A session key pinned to each of the two replicas: replica -> session."""
    found: dict[str, str] = {}
    for i in range(30):
        session = f"kill-{i}"
        reply = http.post("/v1/chat/completions", json=chat(),
                          headers={"x-session-id": session})
        found.setdefault(reply.headers[REPLICA_HEADER], session)
        if len(found) == 2:
            return found
    raise AssertionError(f"30 new sessions all landed on {list(found)}")


def long_request(http: httpx.Client, session: str, out: dict[str, Any], name: str) -> None:
    """A long generation on the session's replica: (reply, when it ended)."""
    reply = http.post("/v1/chat/completions", headers={"x-session-id": session},
                      json=chat("Write a long story about a cat.", max_tokens=400,
                                ignore_eos=True))
    out[name] = (reply, time.perf_counter())


def running_replicas() -> int:
    deployment = serve.status().applications["affinity"].deployments["llamapy-model"]
    return int(deployment.replica_states.get("RUNNING", 0))


def test_a_killed_replica_fails_its_requests_fast_the_other_serves_and_serve_replaces_it(
        http: httpx.Client) -> None:
    sessions = pinned_sessions(http)
    victim, survivor = sorted(sessions)
    results: dict[str, Any] = {}
    threads = [threading.Thread(target=long_request, args=(http, sessions[r], results, r))
               for r in (victim, survivor)]
    with http.stream("POST", "/v1/chat/completions", headers={"x-session-id": sessions[victim]},
                     json=chat("Count to a thousand.", max_tokens=400, ignore_eos=True,
                               stream=True)) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it is generating
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60  # both long requests are on their replicas
        while (stats_of(victim)["slots_active"], stats_of(survivor)["slots_active"]) != (2, 1):
            assert time.monotonic() < deadline, "the long requests never started"
            time.sleep(0.05)
        killed_at = time.perf_counter()
        ray.kill(ray.get_actor(f"SERVE_REPLICA::affinity#llamapy-model#{victim}",
                               namespace="serve"), no_restart=True)
        rest = [line for line in lines if line.startswith("data: ")]
        stream_failed_after = time.perf_counter() - killed_at
    for thread in threads:
        thread.join(120)
    lost, lost_at = results[victim]
    assert lost.status_code == 503 and lost.headers["retry-after"]
    assert lost_at - killed_at < 10  # fast: not a timeout
    assert lost.json()["error"]["code"] == "replica_unavailable"
    assert json.loads(rest[-1][6:])["error"]["code"] == "replica_unavailable"
    assert stream_failed_after < 10
    kept, _ = results[survivor]
    assert kept.status_code == 200 and kept.headers[REPLICA_HEADER] == survivor
    after = http.post("/v1/chat/completions", json=chat(), headers={"x-session-id": "after"})
    assert after.status_code == 200 and after.headers[REPLICA_HEADER] != victim
    deadline = time.monotonic() + 180
    while running_replicas() < 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert running_replicas() == 2
    assert replicas_serving(http, until=time.monotonic() + 60) - {victim, survivor}


def replicas_serving(http: httpx.Client, until: float) -> set[str]:
    """The replicas new sessions land on, asked until two answered (or ``until``): the
    routers learn of a new replica a moment after Serve reports it running."""
    seen: set[str] = set()
    i = 0
    while len(seen) < 2 and time.monotonic() < until:
        reply = http.post("/v1/chat/completions", json=chat(), headers={"x-session-id": f"new-{i}"})
        assert reply.status_code == 200
        seen.add(reply.headers[REPLICA_HEADER])
        i += 1
    return seen
