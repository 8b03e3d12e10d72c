"""``/v1/llamapy/events``, the live view's feed: the first event's shape, the API key, one
snapshot a second per watcher and nothing left running once a watcher disconnects."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from http_helpers import MODEL_ALIAS, chat, wait_slots_free
from live import LiveApp

from llamapy.serve import create_app
from llamapy.serve.metrics.registry import REUSE_SOURCES, SLOT_STATES
from llamapy.server import Server

EVENTS = "/v1/llamapy/events"
#: Most events a test reads while it waits for something to show.
MAX_EVENTS = 30


def events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The ``data:`` events of an SSE response, parsed."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


@contextmanager
def watch(base_url: str, **headers: str) -> Iterator[Iterator[dict[str, Any]]]:
    """A connected watcher's events (closed, so disconnected, on exit)."""
    with httpx.Client(base_url=base_url, timeout=60) as client, \
            client.stream("GET", EVENTS, headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield events(response)


def until(feed: Iterator[dict[str, Any]], check: Any) -> dict[str, Any]:
    """The first event of ``feed`` for which ``check(event)`` holds (bounded)."""
    seen = []
    for _, event in zip(range(MAX_EVENTS), feed, strict=False):
        if check(event):
            return event
        seen.append(event)
    raise AssertionError(f"no matching event in {len(seen)}: last {seen[-1:]}")


def test_the_first_event_describes_slots_queue_and_caches(live: LiveApp) -> None:
    with watch(live.url) as feed:
        first = next(feed)
        second = next(feed)
    assert first["model"] == MODEL_ALIAS and first["state"] == "ready"
    assert first["n_parallel"] == 4 and first["queue_depth"] == 0
    assert [slot["id"] for slot in first["slots"]] == [0, 1, 2, 3]
    for slot in first["slots"]:
        assert slot["state"] in SLOT_STATES
        assert {"cached_tokens", "cache_scope", "session", "prompt_tokens", "is_processing",
                "n_ctx", "num_computed_tokens"} <= slot.keys()
    assert set(first["reused"]) == set(REUSE_SOURCES)
    assert {"bytes", "budget_bytes", "evictions"} <= first["ram_cache"].keys()
    assert {"bytes", "budget_bytes"} <= first["disk_cache"].keys()
    assert {"instability", "kv_pressure"} <= first["events"].keys()
    assert {"sum_s", "count"} == first["ttft"].keys()
    assert first["watchers"] >= 1
    assert 0.5 <= second["time"] - first["time"] <= 5.0  # about once a second


def test_a_repeated_prompt_shows_as_reuse(live: LiveApp, http: httpx.Client) -> None:
    prompt = chat("Tell me about the sea, the sky and the mountains in one sentence.",
                  max_tokens=4)
    with watch(live.url) as feed:
        before = next(feed)
        for _ in range(2):
            assert http.post("/v1/chat/completions", json=prompt).status_code == 200
        after = until(feed, lambda e: e["requests"]["finished"]
                      >= before["requests"]["finished"] + 2)
    wait_slots_free(http)
    assert sum(after["reused"].values()) > sum(before["reused"].values())
    assert after["tokens"]["generated"] > before["tokens"]["generated"]
    assert after["ttft"]["count"] >= before["ttft"]["count"] + 2


def test_the_feed_is_behind_the_api_key(server: Server) -> None:
    with LiveApp(create_app(server, alias=MODEL_ALIAS, api_key="secret")) as app:
        refused = httpx.get(app.url + EVENTS, timeout=30)
        assert refused.status_code == 401
        assert "API key" in refused.json()["error"]["message"]
        wrong = httpx.get(app.url + EVENTS, headers={"Authorization": "Bearer nope"},
                          timeout=30)
        assert wrong.status_code == 401
        with watch(app.url, Authorization="Bearer secret") as feed:
            assert len(next(feed)["slots"]) == 4


def test_a_watcher_that_leaves_ends_its_stream(live: LiveApp) -> None:
    with watch(live.url) as first:
        base = next(first)["watchers"]
        with watch(live.url) as second:
            assert next(second)["watchers"] == base + 1
        assert until(first, lambda e: e["watchers"] == base)["watchers"] == base
    deadline = time.monotonic() + 10
    while True:  # both gone: a new watcher is alone again
        with watch(live.url) as again:
            if next(again)["watchers"] == base:
                break
        assert time.monotonic() < deadline, "a closed watcher's stream kept running"
        time.sleep(0.2)


def test_a_session_shows_its_leased_slot(live: LiveApp, server: Server) -> None:
    with watch(live.url) as feed:
        with server.open_session() as session:
            session.ensure_prefix("<|im_start|>system\nYou review diffs.<|im_end|>\n")
            leased = until(feed, lambda e: any(s["state"] == "leased" for s in e["slots"]))
        slot = next(s for s in leased["slots"] if s["state"] == "leased")
        assert slot["lease_id"] is not None and slot["cached_tokens"] > 0
        until(feed, lambda e: all(s["state"] == "idle" for s in e["slots"]))
