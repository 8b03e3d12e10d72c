"""The serving stack on a simulated GPU: what share of the device's rate reaches the streams.

The fake backend's asynchronous device (``fake_server(device_step_s=S)``) returns from
``decode`` at once and makes the step's outputs readable ``S`` seconds later, as a GPU does;
the tick thread is free meanwhile. With every stream in one batch the ideal rate is
``streams / S`` tokens per second: the share of it that the streams receive is what the
Python around the device costs. Measured in-process (``Server.acomplete_tokens``, all streams
at once) and over HTTP (streaming ``/completion`` with ``return_tokens`` from a server process,
one asyncio client), with the p50/p99 gap between tokens of a stream.

    python bench/bench_device.py                      # steps 2, 5, 10 ms; 1, 16, 64 streams
    python bench/bench_device.py --steps 2 --streams 1 --tokens 200 --no-http
    python bench/bench_device.py --serial ...         # the engine as before the overlap
    python bench/bench_device.py --no-chain ...       # one step a tick (no steady chain)

``--serial`` makes the engine treat the device as synchronous (a token's text and event
before the next step is queued), the order it had before overlapped ticks, for an A/B in one
run. The fake's own bookkeeping (its KV cells, its sampler) runs on the tick thread too and
counts as Python here; a real device's launch costs less.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from llamapy.server import Server
from llamapy.server.fake import fake_server

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


@dataclass(frozen=True, slots=True)
class Result:
    """One measurement."""

    path: str
    step_ms: float
    streams: int
    tokens_per_s: float
    share: float
    gap_p50_ms: float
    gap_p99_ms: float
    #: The step over the mean gap between a stream's tokens: the share of the ideal rate
    #: while streams decode (``share`` counts the whole run, arrivals and first tokens too).
    decode_share: float
    ttft_p50_ms: float

    def row(self) -> str:
        return (f"| {self.path} | {self.step_ms:g} | {self.streams} | {self.tokens_per_s:,.0f} "
                f"| {self.share:.3f} | {self.decode_share:.3f} | {self.gap_p50_ms:.2f} "
                f"| {self.gap_p99_ms:.2f} | {self.ttft_p50_ms:.1f} |")


HEADER = ("| path | step ms | streams | tok/s | share of ideal | decode share | gap p50 ms "
          "| gap p99 ms | TTFT p50 ms |\n|---|---|---|---|---|---|---|---|---|")


@dataclass(slots=True)
class Samples:
    """Every stream's gaps between tokens and times to first token, in seconds."""

    gaps: list[float]
    ttfts: list[float]


class TokenClock:
    """Counts a stream's tokens (from its request's start, now) into ``samples``."""

    def __init__(self, samples: Samples) -> None:
        self.samples, self.last, self.n = samples, time.perf_counter(), 0

    def tick(self) -> None:
        now = time.perf_counter()
        (self.samples.gaps if self.n else self.samples.ttfts).append(now - self.last)
        self.last, self.n = now, self.n + 1


def server_options(streams: int) -> dict[str, object]:
    return {"n_parallel": max(streams, 1), "n_ctx": 64 * max(streams, 1) * 8,
            "max_queue": 4 * streams + 8}


async def one_stream(server: Server, tokens: int, samples: Samples) -> int:
    eog = server.model.eog_tokens()
    intent = server.resolve(max_tokens=tokens, temp=0.0,
                            logit_bias=dict.fromkeys(eog, float("-inf")))
    clock = TokenClock(samples)
    async with server.open_astream(PROMPT, intent) as events:
        async for event in events:
            if getattr(event, "token_id", None) is not None:
                clock.tick()
    return clock.n


def in_process(step_s: float, streams: int, tokens: int) -> Result:
    with fake_server(device_step_s=step_s, **server_options(streams)) as server:
        server.wait_ready(30)
        asyncio.run(_streams(server, 1, 2))  # warm up
        samples = Samples([], [])
        started = time.perf_counter()
        counts = asyncio.run(_streams(server, streams, tokens, samples))
        wall = time.perf_counter() - started
    return result("in-process", step_s, streams, sum(counts) / wall, samples)


async def _streams(server: Server, streams: int, tokens: int,
                   samples: Samples | None = None) -> list[int]:
    sink = Samples([], []) if samples is None else samples
    return list(await asyncio.gather(*(one_stream(server, tokens, sink)
                                       for _ in range(streams))))


def result(path: str, step_s: float, streams: int, rate: float, samples: Samples) -> Result:
    ideal, gaps = streams / step_s, samples.gaps
    q = statistics.quantiles(gaps, n=100) if len(gaps) >= 2 else [0.0] * 99
    decode = step_s / statistics.fmean(gaps) if gaps else 0.0
    ttft = statistics.median(samples.ttfts) * 1000 if samples.ttfts else 0.0
    return Result(path, step_s * 1000, streams, rate, rate / ideal,
                  statistics.median(gaps) * 1000 if gaps else 0.0, q[98] * 1000, decode, ttft)


SERVE = """
import sys, uvicorn
if {switch}:
    sys.setswitchinterval({switch})
from llamapy.serve import create_app
from llamapy.server.fake import fake_server
from llamapy.engine.fake.backend import FakeBackend
if {serial}:
    FakeBackend.async_decode = property(lambda self: False)
if {no_chain}:
    from llamapy.engine.engine import Engine
    Engine._may_chain = lambda self, batch: False
opts = {opts}
server = fake_server(device_step_s={step}, **opts)
uvicorn.run(create_app(server, alias="fake", embeddings=False), host="127.0.0.1",
            port={port}, log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def over_http(step_s: float, streams: int, tokens: int) -> Result:
    port = free_port()
    code = SERVE.format(opts=server_options(streams), step=step_s, port=port, serial=SERIAL[0],
                        switch=SWITCH[0], no_chain=NO_CHAIN[0])
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url)
        samples = Samples([], [])
        counts, wall = asyncio.run(_http_run(url, streams, tokens, samples))
    finally:
        proc.terminate()
        proc.wait(10)
    return result("HTTP SSE", step_s, streams, sum(counts) / wall, samples)


async def _http_run(url: str, streams: int, tokens: int, samples: Samples
                    ) -> tuple[list[int], float]:
    """Each stream's tokens and the run's wall time, each stream on a connection of its own
    opened beforehand (a serving client keeps its connections)."""
    host, port = url.removeprefix("http://").split(":")
    await _streams_on(await _connections(host, int(port), streams), 2, Samples([], []))
    connections = await _connections(host, int(port), streams)
    started = time.perf_counter()
    counts = await _streams_on(connections, tokens, samples)
    return counts, time.perf_counter() - started


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _connections(host: str, port: int, n: int) -> list[Connection]:
    return [await asyncio.open_connection(host, port) for _ in range(n)]


async def _streams_on(connections: list[Connection], tokens: int, samples: Samples
                      ) -> list[int]:
    return list(await asyncio.gather(*(_http_one(c, tokens, samples) for c in connections)))


#: A streamed ``/completion`` chunk carrying a token (the final chunk's list is empty).
TOKEN_CHUNK = re.compile(rb'"tokens":\[\d')


async def _http_one(connection: Connection, tokens: int, samples: Samples) -> int:
    """One stream of llama-server's ``/completion`` with ``return_tokens``, read raw (an HTTP
    client library's own work per chunk and connection would be measured with the server's:
    httpx's pool spends more than the server at 64 streams). Each chunk carries one token,
    counted when it arrives (an OpenAI stream leaves out the chunks of tokens without text,
    which the fake model has)."""
    reader, writer = connection
    body = json.dumps({"prompt": "abcdefgh", "n_predict": tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True, "return_tokens": True}).encode()
    clock = TokenClock(samples)
    address, port = writer.get_extra_info("peername")[:2]
    host = f"{address}:{port}"
    writer.write(b"POST /completion HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (host.encode(), len(body), body))
    tail = b""
    while data := await reader.read(65536):
        tail += data
        *events, tail = tail.split(b"\n\n")
        for event in events:
            if TOKEN_CHUNK.search(event):
                clock.tick()
    writer.close()
    return clock.n


def _wait_health(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the fake server did not start")




SERIAL = [False]
NO_CHAIN = [False]
SWITCH = [0.0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=float, nargs="+", default=[2, 5, 10],
                        help="device steps, ms")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument("--serial", action="store_true",
                        help="no overlap: text and events before the next step is queued")
    parser.add_argument("--no-chain", action="store_true",
                        help="one decode step a tick (no steady chain: llamapy.engine.steady)")
    parser.add_argument("--switch-interval", type=float, default=0.0,
                        help="the server process's GIL switch interval, s (0: Python's)")
    args = parser.parse_args()
    SWITCH[0] = args.switch_interval
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.serial:
        from llamapy.engine.fake.backend import FakeBackend

        FakeBackend.async_decode = property(lambda self: False)  # type: ignore[assignment]
        SERIAL[0] = True
    if args.no_chain:
        from llamapy.engine.engine import Engine

        Engine._may_chain = lambda self, batch: False  # type: ignore[method-assign]
        NO_CHAIN[0] = True
    print(HEADER)
    for step in args.steps:
        for streams in args.streams:
            print(in_process(step / 1000, streams, args.tokens).row(), flush=True)
            if not args.no_http:
                print(over_http(step / 1000, streams, args.tokens).row(), flush=True)


if __name__ == "__main__":
    main()
