#!/usr/bin/env python3
"""Gaps between streamed tokens (and time to first token) of resident servers, alternated.

Every target stays up for the whole run: llama-server (unless ``--no-llama-server``) and each
llamapy checkout named on the command line, optionally with environment variables
(``CHECKOUT,NAME=VALUE,...``; ``.`` is this checkout). Each round sends every target ``--per``
waves of ``--streams`` streamed ``/v1/completions`` (~100-token prompts, 64 tokens out,
greedy, ``ignore_eos``), in an order that rotates and reverses from round to round, so the
machine's drift spreads over all targets. Per target it reports the median and mean gap between
consecutive streamed tokens (the decode step as a client sees it), the median time to first
token, and tok/s over its waves.

A finer instrument than ``bench_http.py``'s tok/s for a change to the per-token path: each
request gives 63 gaps instead of one number per wave, and prefill (the same work in every
target) is kept out of the gap. Needs ``python build_lib.py --with-server`` unless
``--no-llama-server``. Usage:

    python bench/bench_itl.py --rounds 12 . /tmp/other-checkout
    python bench/bench_itl.py --no-llama-server . .,GOMP_SPINCOUNT=3000000

(run nothing else on the machine meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path

import httpx
from http_load import (
    Settings,
    byte_compile,
    llama_server_cmd,
    llamapy_cmd,
    prompts_for,
    start,
    stop,
    token_times,
)

HERE = Path(__file__).resolve().parents[1]


@dataclass
class Target:
    """One resident server and what its requests measured."""

    name: str
    settings: Settings
    checkout: str | None  # None: llama-server
    env: dict[str, str] = field(default_factory=dict)
    gaps: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0

    def start(self) -> subprocess.Popen[bytes]:
        if self.checkout is None:
            return start(llama_server_cmd(self.settings), self.settings.port)[0]
        byte_compile(self.checkout)
        return start(llamapy_cmd(self.settings), self.settings.port, cwd=self.checkout,
                     env=self.env)[0]


def parse_target(spec: str, port: int) -> Target:
    """``CHECKOUT[,NAME=VALUE...]`` -> a llamapy target."""
    checkout, *pairs = spec.split(",")
    path = str(HERE if checkout in ("", ".") else Path(checkout).resolve())
    env = dict(pair.split("=", 1) for pair in pairs)
    return Target(spec, Settings(port=port), path, env)


async def stream_times(client: httpx.AsyncClient, port: int, prompt: str, n_out: int
                       ) -> list[float]:
    """Send time, then the arrival time of every streamed token of one completion."""
    return await token_times(client, f"http://127.0.0.1:{port}/v1/completions", prompt, n_out)


async def run_wave(target: Target, prompts: list[str], n_out: int) -> None:
    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        t0 = time.perf_counter()
        runs = await asyncio.gather(*(stream_times(client, target.settings.port, p, n_out)
                                      for p in prompts))
        target.wall_s += time.perf_counter() - t0
    for times in runs:
        target.ttfts.append(times[1] - times[0])
        target.gaps += [b - a for a, b in pairwise(times[1:])]
        target.tokens += len(times) - 1


def order_of(targets: list[Target], rnd: int) -> list[Target]:
    """Round ``rnd``'s order: rotated by the round, reversed every other round."""
    k = rnd % len(targets)
    order = targets[k:] + targets[:k]
    return order[::-1] if rnd % 2 else order


def report(targets: list[Target]) -> None:
    print("| target | gap median ms | gap mean ms | TTFT median ms | tok/s |")
    print("|---|---|---|---|---|")
    for t in targets:
        print(f"| {t.name} | {1e3 * statistics.median(t.gaps):.2f} | "
              f"{1e3 * statistics.mean(t.gaps):.2f} | {1e3 * statistics.median(t.ttfts):.0f} | "
              f"{t.tokens / t.wall_s:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkouts", nargs="*", default=["."],
                   help="llamapy checkouts to serve, each CHECKOUT[,NAME=VALUE...]")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--streams", type=int, default=1, help="concurrent requests per wave")
    p.add_argument("--per", type=int, default=2, help="waves per target per round")
    p.add_argument("--n-out", type=int, default=64)
    p.add_argument("--no-llama-server", action="store_true")
    args = p.parse_args()
    base = Settings()
    targets = [] if args.no_llama_server else [
        Target("llama-server", replace(base, port=base.port), None)]
    targets += [parse_target(spec, base.port + 1 + i) for i, spec in enumerate(args.checkouts)]
    procs = []
    try:
        for t in targets:
            procs.append(t.start())
            asyncio.run(run_wave(Target(t.name, t.settings, t.checkout),
                                 prompts_for(1, 7, "warm"), 8))  # warm-up, not counted
        for rnd in range(args.rounds):
            for t in order_of(targets, rnd):
                for j in range(args.per):
                    prompts = prompts_for(args.streams, 1000 * rnd + j, t.name[:12])
                    asyncio.run(run_wave(t, prompts, args.n_out))
    finally:
        for proc in procs:
            stop(proc)
    report(targets)


if __name__ == "__main__":
    main()
