#!/usr/bin/env python3
"""Hybrid models across turns: ``python -m llamapy.serve`` against llama-server, each with its
context-checkpoint defaults, on the tiny generated LFM2 (``llamapy.testing.tiny_hybrid_path``:
short-convolution + attention, random weights) or Qwen3.5 (``--arch qwen35``).

Two workloads, one conversation at a time on one slot, greedy, ``ignore_eos`` and a fixed
``max_tokens`` (equal work on both servers):

- **agent**: a ~2,000-token system prompt and a task, then 10 turns of (the assistant's tool
  call, the tool's ~300-token result). The history carries a fixed call text, not what the
  model generated, as an agent's re-rendered history does: each prompt diverges from the
  slot's cache right after the previous prompt;
- **chat**: the same system prompt, 8 user turns of ~60 tokens, the replies fed back as
  generated (the random model's bytes are often not valid UTF-8, so the history differs from
  the cache there too);
- **shared**: 4 agents with that system prompt and their own ~400-token task briefs take 3
  turns each in turn on the one slot: every turn finds another agent's history in the slot
  (sharing only the system prompt) and its own in the RAM cache.

For the agent and chat loops' turns >= 2 it reports the cached share of the reuse ceiling
(the previous turn's whole prompt, which each prompt extends), turns that recomputed
everything, and TTFT p50/p90 (streamed ``/v1/chat/completions``); for the shared loop (all
turns but the very first) the cached share of all prompt tokens and TTFT. Targets alternate
over ``--rounds``.

``--width W`` writes the same architecture ``W`` wide with 6 blocks (random weights, into the
system's temporary folder) instead of the tiny test model, so that a prefill costs what it
would on a small real model and TTFT measures computed tokens rather than HTTP overhead.

Usage: ``python bench/bench_hybrid.py [--rounds 3] [--arch lfm2] [--width 512]`` (nothing else
running).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from http_load import byte_compile, start, stop

from llamapy._paths import current_build
from llamapy.testing import tiny_hybrid_path

PORT, N_CTX, THREADS = 18193, 8192, 2


def llama_server_cmd(model: Path) -> list[str]:
    build = current_build()
    assert build, "run python build_lib.py --with-server"
    return [str(Path(build["lib_dir"]) / "llama-server"), "-m", str(model), "-c", str(N_CTX),
            "-np", "1", "-t", str(THREADS), "-tb", str(THREADS), "--port", str(PORT),
            "--host", "127.0.0.1", "--jinja"]


def llamapy_cmd(model: Path) -> list[str]:
    import sys
    return [sys.executable, "-m", "llamapy.serve", "--model", str(model), "--n-ctx",
            str(N_CTX), "--n-parallel", "1", "--threads", str(THREADS), "--port", str(PORT),
            "--log-level", "warning"]


TARGETS: dict[str, Callable[[Path], list[str]]] = {"llama-server": llama_server_cmd,
                                                   "llamapy.serve": llamapy_cmd}


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "file", "test", "error",
                                "value", "read", "write")) for _ in range(n))


@dataclass(slots=True)
class Run:
    ttfts: list[float] = field(default_factory=list)
    cached: int = 0
    ceiling: int = 0
    full: int = 0

    def q(self, p: float) -> float:
        xs = sorted(self.ttfts)
        return xs[min(len(xs) - 1, int(p * len(xs)))]


def turn(client: httpx.Client, messages: list[dict[str, str]]) -> tuple[float, str, dict]:
    """One streamed turn (retried once on a fresh connection: llama-server closes idle
    keep-alive connections)."""
    try:
        return _turn(client, messages)
    except httpx.RemoteProtocolError:
        return _turn(client, messages)


def _turn(client: httpx.Client, messages: list[dict[str, str]]) -> tuple[float, str, dict]:
    body = {"messages": messages, "max_tokens": 16, "temperature": 0.0, "stream": True,
            "ignore_eos": True}
    t0, ttft, parts, timings = time.perf_counter(), 0.0, [], {}
    with client.stream("POST", "/v1/chat/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            timings = data.get("timings") or timings
            piece = ((data.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if piece is not None and not ttft:
                ttft = time.perf_counter() - t0
            parts.append(piece or "")
    return ttft, "".join(parts), timings


def conversation(kind: str) -> Run:
    rng = random.Random(7)
    messages = [{"role": "system", "content": "You are an agent. " + words(rng, 330)},
                {"role": "user", "content": "Task: " + words(rng, 20)}]
    out, previous = Run(), 0
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}") as client:
        for k in range(10 if kind == "agent" else 8):
            ttft, reply, timings = turn(client, messages)
            cached, total = int(timings.get("cache_n", 0)), 0
            total = cached + int(timings.get("prompt_n", 0))
            if k:
                out.ttfts.append(ttft)
                out.cached += min(cached, previous)
                out.ceiling += previous
                out.full += cached == 0
            previous = total
            if kind == "agent":
                messages += [{"role": "assistant", "content": f'call read_file("f{k}.txt")'},
                             {"role": "user", "content": "Result: " + words(rng, 50)}]
            else:
                messages += [{"role": "assistant", "content": reply},
                             {"role": "user", "content": words(rng, 10)}]
    return out


def shared() -> Run:
    """The shared workload (``ceiling``: all prompt tokens, so the share is of the prompt)."""
    rng = random.Random(7)
    system = "You are an agent. " + words(rng, 330)
    chats = [[{"role": "system", "content": system},
              {"role": "user", "content": f"Agent {i} brief: " + words(rng, 70)}]
             for i in range(4)]
    out = Run()
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}") as client:
        for k in range(3):
            for i, messages in enumerate(chats):
                ttft, _, timings = turn(client, messages)
                cached = int(timings.get("cache_n", 0))
                if k or i:
                    out.ttfts.append(ttft)
                    out.cached += cached
                    out.ceiling += cached + int(timings.get("prompt_n", 0))
                    out.full += cached == 0
                messages += [{"role": "assistant", "content": f'call run("step {k}")'},
                             {"role": "user", "content": "Result: " + words(rng, 40)}]
    return out


def wide_model(arch: str, width: int) -> Path:
    """The tiny model's architecture ``width`` wide, 6 blocks deep (written once)."""
    import tempfile

    from llamapy.testing import tiny_hybrid as tiny

    out = Path(tempfile.gettempdir()) / f"llamapy-bench-{arch}-{width}.gguf"
    if out.exists():
        return out
    dims = ("_EMBD", "_FF", "_HEAD_DIM", "_LAYERS", "_SSM_HEAD")
    saved = {name: getattr(tiny, name) for name in dims}
    try:
        values = (width, 3 * width, width // tiny._HEADS, 6, 64)
        for name, value in zip(dims, values, strict=True):
            setattr(tiny, name, value)
        tiny.write_tiny_hybrid(out.with_suffix(".part"), arch)
    finally:
        for name, value in saved.items():
            setattr(tiny, name, value)
    return out.with_suffix(".part").rename(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--arch", default="lfm2")
    p.add_argument("--width", type=int, default=0, help="a wider model (see the docstring)")
    args = p.parse_args()
    byte_compile()
    model = wide_model(args.arch, args.width) if args.width else tiny_hybrid_path(arch=args.arch)
    runs: dict[tuple[str, str], list[Run]] = {}
    order = list(TARGETS)
    for rnd in range(args.rounds):
        for name in order if rnd % 2 == 0 else order[::-1]:
            proc, _ = start(TARGETS[name](model), PORT)
            try:
                for kind in ("agent", "chat", "shared"):
                    r = shared() if kind == "shared" else conversation(kind)
                    runs.setdefault((kind, name), []).append(r)
                    print(f"round {rnd} {name:13s} {kind:6s} reuse/ceiling "
                          f"{100 * r.cached / max(1, r.ceiling):5.1f}%  full {r.full}  "
                          f"TTFT p50 {1000 * r.q(0.5):6.1f} ms p90 {1000 * r.q(0.9):6.1f} ms",
                          flush=True)
            finally:
                stop(proc)
    print(f"\n| {model.name}, turns >= 2 | llama-server | llamapy.serve | ratio |")
    print("|---|---|---|---|")
    for kind in ("agent", "chat", "shared"):
        a, b = runs[(kind, order[0])], runs[(kind, order[1])]
        for label, fn in (("reuse / ceiling %", lambda r: 100 * r.cached / max(1, r.ceiling)),
                          ("full re-prefills", lambda r: r.full),
                          ("TTFT p50 ms", lambda r: 1000 * r.q(0.5)),
                          ("TTFT p90 ms", lambda r: 1000 * r.q(0.9))):
            xa, xb = statistics.median(map(fn, a)), statistics.median(map(fn, b))
            ratio = f"{xb / xa:.2f}" if xa else "-"
            print(f"| {kind}: {label} | {xa:.1f} | {xb:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
