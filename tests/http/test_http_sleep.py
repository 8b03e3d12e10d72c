"""``--sleep-idle-seconds``: the model is unloaded when idle and reloaded by the next request
(the manager's part, holds and the idle-unload hook, is in ``tests/manager/test_manager_holds``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from http_helpers import MODEL_ALIAS, WAIT_S, free_port, poll
from live import LiveApp

from llamapy.openai_api import llama_compat
from llamapy.serve import create_app
from llamapy.server import Server

PROMPT = {"prompt": "The capital of France is", "n_predict": 6, "temperature": 0}


def wait_sleeping(http: httpx.Client, sleeping: bool = True) -> dict:
    """Poll ``/props`` (which never wakes the model) until ``is_sleeping`` is ``sleeping``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        props = http.get("/props").json()
        if props["is_sleeping"] is sleeping:
            return props
        assert time.monotonic() < deadline, props
        time.sleep(0.1)


@pytest.fixture()
def sleepy(model_path: Path) -> Iterator[tuple[httpx.Client, list[Server]]]:
    """An app whose model sleeps after 1 idle second, and every Server its loader made."""
    servers: list[Server] = []

    def load() -> Server:
        servers.append(Server(model_path, n_ctx=512, n_parallel=1, n_threads=1))
        return servers[-1]

    app = create_app(load, alias=MODEL_ALIAS, sleep_idle_seconds=1, own_server=True)
    with LiveApp(app) as live, httpx.Client(base_url=live.url, timeout=120) as http:
        poll(http, "/health", 200)
        try:
            yield http, servers
        finally:
            for server in servers:
                server.close()


def test_sleeps_when_idle_and_wakes_for_a_request(sleepy: tuple[httpx.Client, list[Server]]
                                                  ) -> None:
    http, servers = sleepy
    poll(http, "/v1/models", 200)
    awake = http.post("/completion", json=PROMPT)
    assert awake.status_code == 200, awake.text
    props = wait_sleeping(http)
    assert props["total_slots"] == 1 and props["model_alias"] == MODEL_ALIAS
    assert not servers[0].ready  # weights and KV freed
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/v1/models").json()["data"][0]["id"] == MODEL_ALIAS
    assert http.get(f"/v1/models/{MODEL_ALIAS}").json()["id"] == MODEL_ALIAS
    assert http.get("/v1/models/other").status_code == 404
    metrics = http.get("/metrics")  # the engine's counters as they were when it fell asleep
    assert metrics.status_code == 200
    generated = [line for line in metrics.text.splitlines()
                 if line.startswith("llamapy_generated_tokens_total ")]
    assert generated and float(generated[0].split()[1]) >= 6
    assert f'model_name="{MODEL_ALIAS}"' in metrics.text
    assert http.get("/props").json()["is_sleeping"] is True  # read-only routes never wake it
    assert len(servers) == 1
    woken = http.post("/completion", json=PROMPT)  # waits for the reload
    assert woken.status_code == 200, woken.text
    assert len(servers) == 2 and servers[1].ready
    # both runs are one request on a fresh context: the same batch shapes, the same tokens
    assert woken.json()["content"] == awake.json()["content"]
    assert woken.json()["content"].strip()
    assert http.get("/props").json()["is_sleeping"] is False
    wait_sleeping(http)  # and it sleeps again


def test_token_counting_wakes_it(sleepy: tuple[httpx.Client, list[Server]]) -> None:
    http, servers = sleepy
    wait_sleeping(http)
    counted = http.post("/v1/chat/completions/input_tokens",
                        json={"messages": [{"role": "user", "content": "Hello world"}]})
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] > 0
    assert http.get("/props").json()["is_sleeping"] is False
    assert len(servers) == 2


def test_sleep_flag_on_the_command_line(model_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "llamapy.serve", "-m", str(model_path), "-c", "512",
               "-np", "1", "-t", "1", "--sleep-idle-seconds", "1", "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            poll(http, "/health", 200)
            wait_sleeping(http)
            done = http.post("/completion", json=PROMPT)
            assert done.status_code == 200, done.text
            assert done.json()["tokens_predicted"] >= 1
            assert http.get("/props").json()["is_sleeping"] is False
    finally:
        process.terminate()
        process.wait(WAIT_S)


def test_the_live_view_says_sleeping_and_watching_does_not_wake_it(
        sleepy: tuple[httpx.Client, list[Server]]) -> None:
    http, servers = sleepy
    wait_sleeping(http)
    with http.stream("GET", "/v1/llamapy/events") as feed:
        assert feed.status_code == 200
        lines = (line for line in feed.iter_lines() if line.startswith("data: "))
        first, second = json.loads(next(lines)[6:]), json.loads(next(lines)[6:])
    for event in (first, second):
        assert event["state"] == "sleeping" and event["slots"] == []
        assert event["model"] == MODEL_ALIAS
    assert http.get("/props").json()["is_sleeping"] is True and len(servers) == 1


def test_props_read_across_the_moment_the_model_falls_asleep(
        sleepy: tuple[httpx.Client, list[Server]], monkeypatch: pytest.MonkeyPatch) -> None:
    # The first /props read is held 2 s, past the 1 s idle limit: the model must not be
    # closed under it (it was: a 503 "server is not running" instead of the props).
    http, servers = sleepy
    assert http.post("/completion", json=PROMPT).status_code == 200
    calls: list[float] = []
    live_props = llama_compat.props

    def slow_props(served: object) -> dict:
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(2.0)
        return live_props(served)  # type: ignore[arg-type]

    monkeypatch.setattr(llama_compat, "props", slow_props)
    held = http.get("/props")
    assert held.status_code == 200, held.text
    assert held.json()["is_sleeping"] is False
    assert wait_sleeping(http)["model_alias"] == MODEL_ALIAS
    assert len(calls) >= 2 and calls[1] - calls[0] >= 2.0  # the snapshot waited for the read
    assert len(servers) == 1 and not servers[0].ready
