"""Concurrent streams, and a client that goes away cancelling its request."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import openai
import pytest
from http_helpers import MODEL_ALIAS, chat, wait_slots_free
from live import LiveApp

from llamapy.serve import create_app
from llamapy.server import Server

TOPICS = ["cats", "rivers", "stars", "bread", "trains", "snow", "music", "forests"]


def metric(http: httpx.Client, name: str) -> float:
    """One unlabelled sample of ``/metrics``."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def endless(server: Server, **fields: object) -> dict:
    """A request that would run for ``max_tokens`` (end-of-generation tokens banned)."""
    banned = {str(t): False for t in (server.model.eos, server.model.eot) if t >= 0}
    return chat("Write a very long essay.", max_tokens=1000, logit_bias=banned, **fields)


async def test_sixteen_concurrent_streams_all_finish(live: LiveApp) -> None:
    client = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0,
                                timeout=120)

    async def one(index: int) -> tuple[str, str | None, int]:
        stream = await client.chat.completions.create(
            model=MODEL_ALIAS, temperature=0, max_tokens=12, stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": f"One fact about {TOPICS[index % 8]}."}])
        text, finish, tokens = "", None, 0
        async for chunk in stream:
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish, tokens

    results = await asyncio.gather(*(one(i) for i in range(16)))
    await client.close()
    # (texts are not compared: llama.cpp's logits depend slightly on the batch's make-up)
    assert all(text and finish in ("stop", "length") and tokens > 0
               for text, finish, tokens in results)


def test_disconnect_mid_stream_frees_the_slot(http: httpx.Client, server: Server) -> None:
    cancelled = metric(http, "llamapy_cancelled_total")
    with http.stream("POST", "/v1/chat/completions", json=endless(server, stream=True)) as r:
        lines = r.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert len(received) >= 3
        assert any(s["is_processing"] for s in http.get("/slots").json())
    # the client closed the connection after a few chunks: the slot must come free at once
    slots = wait_slots_free(http, timeout=10)
    assert all(s["state"] == "idle" for s in slots)
    assert metric(http, "llamapy_cancelled_total") == cancelled + 1


def test_disconnect_during_a_plain_request_cancels_it(live: LiveApp, http: httpx.Client,
                                                      server: Server) -> None:
    cancelled = metric(http, "llamapy_cancelled_total")
    with httpx.Client(base_url=live.url, timeout=httpx.Timeout(60, read=1.0)) as impatient:
        try:
            impatient.post("/v1/chat/completions", json=endless(server))
        except httpx.ReadTimeout:
            pass  # gave up waiting and closed the connection
        else:
            raise AssertionError("a 1000-token request answered within a second")
    wait_slots_free(http, timeout=10)
    assert metric(http, "llamapy_cancelled_total") == cancelled + 1


def test_disconnect_while_queued_cancels_the_queued_request(model_path: Path) -> None:
    with Server(model_path, n_ctx=2048, n_parallel=1, max_queue=4, n_threads=1) as server, \
            LiveApp(create_app(server)) as live, \
            httpx.Client(base_url=live.url, timeout=60) as http:
        server.wait_ready(60)
        with http.stream("POST", "/v1/chat/completions",
                         json=endless(server, model=None, stream=True)) as running:
            lines = running.iter_lines()
            next(lines)  # the only slot is busy from now on
            impatient = httpx.Client(base_url=live.url, timeout=httpx.Timeout(60, read=1.0))
            with impatient, pytest.raises(httpx.ReadTimeout):  # queued: no first byte
                impatient.post("/v1/chat/completions",
                               json=chat("hi", model=None, stream=True, max_tokens=4))
            deadline = time.monotonic() + 5  # well before the running request could end
            while (stats := server.stats())["queue_depth"] or not stats["num_cancelled"]:
                assert time.monotonic() < deadline, stats
                time.sleep(0.02)
            assert stats["slots_active"] == 1  # the running stream is untouched
        wait_slots_free(http, timeout=10)
