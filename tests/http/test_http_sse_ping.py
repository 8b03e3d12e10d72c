"""llama-server's ``--sse-ping-interval``: a stream silent for that long gets a keep-alive
comment (``:``), which clients ignore; none after the stream ended, none when disabled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from http_helpers import MODEL_ALIAS
from live import LiveApp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from llamapy.serve import create_app
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.serving import app_options
from llamapy.serve.sse import PING, EventStreamResponse
from llamapy.server import Server


class _Source:
    async def aclose(self) -> None:
        return None


def _app(ping_s: float | None) -> Starlette:
    async def slow() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        await asyncio.sleep(0.35)
        yield b"data: 2\n\n"

    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(slow(), _Source(), ping_s)  # type: ignore[arg-type]

    return Starlette(routes=[Route("/s", endpoint)])


@pytest.mark.parametrize(("ping_s", "least", "most"), [(0.1, 2, 4), (None, 0, 0)])
def test_a_silent_stream_gets_keep_alives_between_its_events(ping_s: float | None,
                                                             least: int, most: int) -> None:
    with LiveApp(_app(ping_s)) as app:
        started = time.monotonic()
        body = httpx.get(app.url + "/s", timeout=30).content
        took = time.monotonic() - started  # 0.35 s, or longer on a stalled machine
    assert body.startswith(b"data: 1\n\n") and body.endswith(b"data: 2\n\n")
    assert least <= body.count(PING) <= most * took / 0.35  # one a ping_s, not a flood


def test_pings_on_the_real_model_leave_the_stream_intact(server: Server) -> None:
    app = create_app(server, alias=MODEL_ALIAS, sse_ping_interval=0.001)
    body = {"model": MODEL_ALIAS, "prompt": "Once upon a time", "max_tokens": 12,
            "temperature": 0, "stream": True, "ignore_eos": True}
    with LiveApp(app) as live, httpx.Client(base_url=live.url, timeout=120) as http:
        with http.stream("POST", "/v1/completions", json=body) as resp:
            lines = list(resp.iter_lines())
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
        chunks = list(client.completions.create(
            model=MODEL_ALIAS, prompt="Once upon a time", max_tokens=12, temperature=0,
            stream=True, extra_body={"ignore_eos": True}))
    assert ":" in lines  # a keep-alive between tokens (each takes well over 1 ms)
    data = [line for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len(data) >= 12 and text  # the official client skips the comments


def test_the_flag_sets_the_interval() -> None:
    parser = build_parser()
    assert app_options(parser.parse_args([]))["sse_ping_interval"] == 30.0
    assert app_options(parser.parse_args(["--sse-ping-interval", "-1"]))[
        "sse_ping_interval"] == -1.0
