#!/usr/bin/env python3
"""Multi-turn chat at equal work: ``python -m llamapy.serve`` against llama-server.

16 conversations x 4 turns; every conversation opens with the same ~300-token system prompt,
then its own user turns (~25 words) and the replies (greedy, up to 64 tokens, both servers
stop at EOS). 4 slots, 4 turns in flight, streaming ``/v1/chat/completions``: the 16
conversations take turns (a turn waits for one of 4 places, first come first served), so a
conversation's next turn rarely finds its history still in a slot: its history (16 x ~550
tokens) does not fit the KV cache, but fits RAM. ``--sticky`` holds a place for a
conversation's 4 turns instead (4 conversations at a time, each keeping its slot). Each
server runs alone with its serving defaults (llama-server keeps a RAM prompt cache by
default; so does ``llamapy.serve`` now). Reported for turns >= 2: the cached share of prompt
tokens (``timings.cache_n / (cache_n + prompt_n)``) and TTFT p50/p90.

``--baseline CHECKOUT`` compares with the ``llamapy.serve`` of another checkout instead of
llama-server (is a change to the caches faster or slower on this workload?).

Usage: ``python bench/bench_multiturn.py [--rounds 2] [--sticky] [--baseline CHECKOUT]``
(nothing else on the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from http_load import Settings, byte_compile, llama_server_cmd, llamapy_cmd, start, stop, text_of

Target = tuple[Callable[[Settings], list[str]], str | None]  # its command, the checkout
TARGETS: dict[str, Target] = {"llama-server": (llama_server_cmd, None),
                              "llamapy.serve": (llamapy_cmd, None)}


@dataclass(slots=True)
class Turns:
    """Later-turn measurements of one run."""

    ttfts: list[float] = field(default_factory=list)
    cached: int = 0
    prompt: int = 0
    wall_s: float = 0.0

    def q(self, p: float) -> float:
        xs = sorted(self.ttfts)
        return xs[min(len(xs) - 1, int(p * len(xs)))]


async def turn(client: httpx.AsyncClient, messages: list[dict[str, str]]
               ) -> tuple[float, str, dict]:
    """One streamed turn; a connection the server dropped before answering (llama-server
    closes idle keep-alive connections) is retried once on a fresh one."""
    try:
        return await _turn(client, messages)
    except httpx.RemoteProtocolError:
        return await _turn(client, messages)


async def _turn(client: httpx.AsyncClient, messages: list[dict[str, str]]
                ) -> tuple[float, str, dict]:
    body = {"messages": messages, "max_tokens": 64, "temperature": 0.0, "stream": True}
    t0, ttft, parts, timings = time.perf_counter(), 0.0, [], {}
    async with client.stream("POST", "/v1/chat/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            timings = data.get("timings") or timings
            piece = ((data.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if piece:
                ttft = ttft or time.perf_counter() - t0
                parts.append(piece)
    return ttft, "".join(parts), timings


async def conversation(client: httpx.AsyncClient, i: int, system: str, out: Turns,
                       gate: asyncio.Semaphore, sticky: bool) -> None:
    rng = random.Random(500 + i)
    messages = [{"role": "system", "content": system}]
    async with (gate if sticky else contextlib.nullcontext()):
        for k in range(4):
            messages.append({"role": "user", "content": f"Turn {k}: " + text_of(rng, 25)})
            async with (contextlib.nullcontext() if sticky else gate):
                ttft, reply, timings = await turn(client, messages)
            messages.append({"role": "assistant", "content": reply})
            if k:
                out.ttfts.append(ttft)
                out.cached += int(timings.get("cache_n", 0))
                out.prompt += int(timings.get("cache_n", 0)) + int(timings.get("prompt_n", 0))


async def workload(port: int, sticky: bool) -> Turns:
    system = "You are a careful assistant. " + text_of(random.Random(3), 280)
    out, gate = Turns(), asyncio.Semaphore(4)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(client, i, system, out, gate, sticky)
                               for i in range(16)))
        out.wall_s = time.perf_counter() - t0
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sticky", action="store_true",
                   help="4 conversations at a time, each keeping its place for its 4 turns")
    p.add_argument("--baseline", metavar="CHECKOUT",
                   help="compare with the llamapy.serve of this checkout, not llama-server")
    args = p.parse_args()
    byte_compile()
    targets = dict(TARGETS)
    if args.baseline:
        byte_compile(args.baseline)
        del targets["llama-server"]
        targets = {f"llamapy {Path(args.baseline).name}": (llamapy_cmd, args.baseline), **targets}
    s = Settings(n_parallel=4)
    runs: dict[str, list[Turns]] = {name: [] for name in targets}
    order = list(targets)
    for rnd in range(args.rounds):
        for name in (order if rnd % 2 == 0 else order[::-1]):
            cmd, checkout = targets[name]
            proc, _ = start(cmd(s), s.port, cwd=checkout)
            try:
                r = asyncio.run(workload(s.port, args.sticky))
            finally:
                stop(proc)
            runs[name].append(r)
            print(f"round {rnd} {name:13s} cached {100 * r.cached / max(1, r.prompt):5.1f}%  "
                  f"TTFT p50 {r.q(0.5):.3f} p90 {r.q(0.9):.3f}  wall {r.wall_s:.1f}s",
                  flush=True)
    print(f"\n| turns >= 2 | {order[0]} | {order[1]} | ratio |\n|---|---|---|---|")
    a, b = runs[order[0]], runs[order[1]]
    for label, fn in (("cached share %", lambda r: 100 * r.cached / max(1, r.prompt)),
                      ("TTFT p50 s", lambda r: r.q(0.5)), ("TTFT p90 s", lambda r: r.q(0.9)),
                      ("wall s", lambda r: r.wall_s)):
        xa, xb = statistics.median(map(fn, a)), statistics.median(map(fn, b))
        print(f"| {label} | {xa:.3f} | {xb:.3f} | {xb / xa:.2f} |")

if __name__ == "__main__":
    main()
