"""Load for the HTTP benchmarks: start a server process, stream completions at it.

Both targets (``llama-server`` and ``python -m llamapy.serve``) get the same model, threads,
``n_ctx``, ``n_parallel`` and ``n_batch``, and the same requests: streaming
``/v1/completions``, greedy, ``ignore_eos`` (so both generate exactly ``max_tokens``).
The load is one asyncio client in this process (httpx), so both pay the same client cost.
:func:`byte_compile` compiles a checkout's ``llamapy`` first, as an installed package is (this
sandbox sets ``PYTHONDONTWRITEBYTECODE``: without it every start compiles from source).
"""

from __future__ import annotations

import asyncio
import compileall
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llamapy._paths import current_build
from llamapy.models import default_model_path

WORDS = tuple(
    "river mountain quantum garden lantern copper violet harbor meadow signal canvas orbit "
    "pepper marble thunder cedar falcon ember glacier velvet prism comet".split()
)


def text_of(rng: random.Random, n_words: int) -> str:
    """Words from a small vocabulary (about one token each)."""
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


@dataclass(frozen=True, slots=True)
class Settings:
    """What both servers are started with."""

    n_ctx: int = 8192
    n_parallel: int = 4
    n_batch: int = 2048
    threads: int = 2
    port: int = 18191
    #: Run ``python -m llamapy.serve`` from this checkout (e.g. an older commit to compare).
    llamapy_dir: str | None = None
    #: Send ``ignore_eos`` (an older llamapy without it answers 400).
    ignore_eos: bool = True


@dataclass(slots=True)
class Wave:
    """One wave of concurrent streams."""

    wall_s: float
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    def ttft(self, q: float) -> float:
        xs = sorted(self.ttfts)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def llama_server_cmd(s: Settings) -> list[str]:
    build = current_build()
    assert build, "run python build_lib.py --with-server"
    exe = Path(build["lib_dir"]) / "llama-server"
    return [str(exe), "-m", str(default_model_path()), "-c", str(s.n_ctx), "-np",
            str(s.n_parallel), "-b", str(s.n_batch), "-t", str(s.threads), "-tb",
            str(s.threads), "--port", str(s.port), "--host", "127.0.0.1", "-kvu", "-fa", "auto"]


def llamapy_cmd(s: Settings) -> list[str]:
    return [sys.executable, "-m", "llamapy.serve", "--model", str(default_model_path()),
            "--n-ctx", str(s.n_ctx), "--n-parallel", str(s.n_parallel), "--n-batch",
            str(s.n_batch), "--threads", str(s.threads), "--port", str(s.port),
            "--log-level", "warning"]


def byte_compile(checkout: str | Path | None = None) -> None:
    """Byte-compile ``checkout``'s ``llamapy`` (default: this one), quietly."""
    root = Path(checkout) if checkout else Path(__file__).resolve().parents[1]
    compileall.compile_dir(root / "llamapy", quiet=1)


def start(cmd: list[str], port: int, timeout: float = 120.0, cwd: str | None = None,
          env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], float]:
    """Start a server (in ``cwd``, with ``env`` added to this process's environment);
    returns it and the seconds until ``/health`` answered 200.

    One client polls every 5 ms: a new ``httpx`` client per poll (an SSL context each) cost
    milliseconds of CPU per poll on this 2-core machine, taken from the starting server."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd,
                            env={**os.environ, **env} if env else None)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=1) as client:
        while time.perf_counter() - started < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with status {proc.returncode}")
            try:
                if client.get("/health").status_code == 200:
                    return proc, time.perf_counter() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.005)
    proc.kill()
    raise RuntimeError(f"{cmd[0]} did not become healthy")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


async def token_times(client: httpx.AsyncClient, url: str, prompt: str, n_out: int,
                      ignore_eos: bool = True) -> list[float]:
    """One streamed completion at ``url``: the send time, then each streamed token's arrival
    (SSE chunks with text)."""
    body: dict[str, object] = {"prompt": prompt, "max_tokens": n_out, "temperature": 0.0,
                               "stream": True}
    if ignore_eos:
        body["ignore_eos"] = True
    times = [time.perf_counter()]
    async with client.stream("POST", url, json=body, timeout=600) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if choices and choices[0].get("text") is not None:
                times.append(time.perf_counter())
    return times


async def stream_one(client: httpx.AsyncClient, prompt: str, n_out: int,
                     ignore_eos: bool = True) -> tuple[float, int]:
    """One streamed completion: (time to first token, tokens received)."""
    times = await token_times(client, "/v1/completions", prompt, n_out, ignore_eos)
    return (times[1] - times[0] if len(times) > 1 else 0.0), len(times) - 1


async def wave(port: int, prompts: list[str], n_out: int, ignore_eos: bool = True) -> Wave:
    """All ``prompts`` at once; streamed tokens counted as SSE chunks with text."""
    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(stream_one(client, p, n_out, ignore_eos)
                                         for p in prompts))
        wall = time.perf_counter() - t0
    return Wave(wall, [r[0] for r in results], sum(r[1] for r in results))


async def serial_wave(port: int, prompts: list[str], n_out: int, ignore_eos: bool = True
                      ) -> Wave:
    """``prompts`` one after another, each a one-request :func:`wave` (its own connection,
    as at c=1: llama-server drops a reused connection after some streamed responses, 9 of
    60 here): one stream at a time, more tokens per measurement than one request."""
    waves = [await wave(port, [p], n_out, ignore_eos) for p in prompts]
    return Wave(sum(w.wall_s for w in waves), [t for w in waves for t in w.ttfts],
                sum(w.tokens for w in waves))


def prompts_for(c: int, seed: int, tag: str) -> list[str]:
    """``c`` distinct ~100-token prompts (no reuse between waves or targets)."""
    rng = random.Random(seed)
    return [f"[{tag}] Request {rng.random():.6f}: " + text_of(rng, 90) for _ in range(c)]


def first_token_s(port: int) -> float:
    """Seconds to the first streamed token of one fresh request."""
    w = asyncio.run(wave(port, prompts_for(1, 999, "first"), 2))
    return w.ttfts[0]
