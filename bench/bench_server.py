#!/usr/bin/env python3
"""llamapy against llama-server from the same llama.cpp build, in one run.

Targets: ``llama-server`` (HTTP), ``llamapy`` (the Server in-process) and ``llamapy-http``
(``python -m llamapy.serve``), with the same model, threads, n_ctx, n_parallel and n_batch;
greedy sampling. Workloads, side by side:

1. concurrency 1/4/8/16: ~100-token prompts (unique per request), 64 tokens out, streaming,
   three waves per level; aggregate generated tok/s and time to first token (mean/p50/p99)
2. a wave of 8 requests sharing a ~500-token prefix (distinct tails), cold then warm
3. (HTTP targets) interleaved multi-turn chats: 12 conversations of 4 turns on 8 slots, through
   ``/v1/chat/completions``; TTFT of the later turns
4. Python time per tick as a share of tick time (in-process llamapy, concurrency-8 run)

All three run at once (an idle server blocks and uses no CPU) and the concurrency waves are
interleaved target by target, so drift of the shared machine hits all of them alike.

Needs ``python build_lib.py --with-server``. Usage: ``python bench/bench_server.py``
(``--quick`` for fewer levels).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from llamapy._paths import current_build
from llamapy._system import physical_cores
from llamapy.engine import TokenEvent
from llamapy.models import default_model_path
from llamapy.server import Server

WORDS = tuple(
    "river mountain quantum garden lantern copper violet harbor meadow signal canvas orbit "
    "pepper marble thunder cedar falcon ember glacier velvet prism comet".split()
)


def text_of(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


@dataclass
class Result:
    wall_s: float
    ttfts: list[float]
    tokens: int

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s

    def ttft(self, q: float) -> float:
        xs = sorted(self.ttfts)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


Runner = Callable[[str, int], tuple[float, int]]


def run_wave(runner: Runner, prompts: list[str], n_out: int) -> Result:
    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: runner(p, n_out), prompts))
    wall = time.perf_counter() - start
    return Result(wall, [r[0] for r in results], sum(r[1] for r in results))


def llamapy_runner(server: Server) -> Runner:
    def run(prompt: str, n_out: int) -> tuple[float, int]:
        tokens = server.tokenize(prompt)
        t0 = time.perf_counter()
        ttft, n = 0.0, 0
        for event in server.events(tokens, max_tokens=n_out, temp=0.0, timeout=300):
            if isinstance(event, TokenEvent):
                if n == 0:
                    ttft = time.perf_counter() - t0
                n += 1
        return ttft, n
    return run


def llama_server_runner(url: str) -> Runner:
    def run(prompt: str, n_out: int) -> tuple[float, int]:
        body = {"prompt": prompt, "n_predict": n_out, "temperature": 0.0, "stream": True,
                "cache_prompt": True}
        t0 = time.perf_counter()
        ttft, n = 0.0, 0
        with httpx.stream("POST", f"{url}/completion", json=body, timeout=300) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = json.loads(line[6:])
                if data.get("content") or (n == 0 and not data.get("stop")):
                    if n == 0:
                        ttft = time.perf_counter() - t0
                    n += 1
                if data.get("stop"):
                    n = data.get("tokens_predicted", n)
                    break
        return ttft, n
    return run


def chat_turn(url: str, messages: list[dict[str, str]], n_out: int) -> tuple[float, str]:
    """One streamed chat turn; returns (TTFT, reply text)."""
    body = {"messages": messages, "max_tokens": n_out, "temperature": 0.0, "stream": True,
            "cache_prompt": True}
    t0 = time.perf_counter()
    ttft, parts = 0.0, []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            piece = (choices[0].get("delta") or {}).get("content")
            if piece:
                if not parts:
                    ttft = time.perf_counter() - t0
                parts.append(piece)
    return ttft, "".join(parts)


def multi_turn(name: str, url: str, n_conv: int = 12, turns: int = 4) -> Result:
    """Concurrent conversations, each turn after the previous reply; TTFT of turns 2..n."""
    def conversation(i: int) -> list[float]:
        rng = random.Random(1000 + i)
        messages = [{"role": "system", "content": f"Persona {i}: " + text_of(rng, 250)}]
        ttfts = []
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Turn {turn}: " + text_of(rng, 25)})
            ttft, reply = chat_turn(url, messages, 32)
            messages.append({"role": "assistant", "content": reply})
            if turn:
                ttfts.append(ttft)
        return ttfts

    start = time.perf_counter()
    with ThreadPoolExecutor(n_conv) as pool:
        ttfts = [t for ts in pool.map(conversation, range(n_conv)) for t in ts]
    r = Result(time.perf_counter() - start, ttfts, 0)
    print(f"{name:10s} multi-turn: wall {r.wall_s:.2f}s  later-turn TTFT mean "
          f"{statistics.mean(ttfts):.3f} p50 {r.ttft(0.5):.3f} p99 {r.ttft(0.99):.3f}",
          flush=True)
    return r


def wait_healthy(proc: subprocess.Popen[bytes], port: int) -> subprocess.Popen[bytes]:
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server on port {port} did not start")


def start_llama_server(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    build = current_build()
    assert build, "run python build_lib.py --with-server"
    exe = Path(build["lib_dir"]) / "llama-server"
    cmd = [str(exe), "-m", str(default_model_path()), "-c", str(args.n_ctx), "-np",
           str(args.n_parallel), "-b", str(args.n_batch), "-t", str(args.threads), "-tb",
           str(args.threads), "--port", str(port), "--host", "127.0.0.1", "-kvu", "-fa", "auto"]
    return wait_healthy(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL), port)


def start_llamapy_http(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "llamapy.serve", "--model", str(default_model_path()),
           "--n-ctx", str(args.n_ctx), "--n-parallel", str(args.n_parallel), "--n-batch",
           str(args.n_batch), "--threads", str(args.threads), "--port", str(port),
           "--prompt-cache-ram-mb", "256", "--log-level", "warning"]
    return wait_healthy(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL), port)


class TickTimer:
    """Splits engine tick time into native work (``llama_decode`` and native sampling) and the
    Python around it: the engine, batch filling, events (tick thread only)."""

    def __init__(self, server: Server) -> None:
        self.tick_s = self.native_s = 0.0
        self.ticks = 0
        self.on = False
        from llamapy.llama_backend import LlamaSampler

        def native(fn: Callable[..., object]) -> Callable[..., object]:
            def timed(*args: object) -> object:
                t = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    if self.on:
                        self.native_s += time.perf_counter() - t
            return timed

        def install(engine: object) -> None:
            backend = engine.backend  # type: ignore[attr-defined]
            tick = engine.tick

            def timed_tick() -> bool:
                t = time.perf_counter()
                out = tick()
                if self.on:
                    self.tick_s += time.perf_counter() - t
                    self.ticks += 1
                return out

            engine.tick = timed_tick  # type: ignore[attr-defined]
            backend.ctx.decode = native(backend.ctx.decode)
            LlamaSampler.sample = native(LlamaSampler.sample)  # type: ignore[method-assign]

        server.call(install)

    @property
    def python_share(self) -> float:
        return (self.tick_s - self.native_s) / self.tick_s if self.tick_s else 0.0


def concurrency_levels(runners: dict[str, Runner], levels: list[int], reps: int = 3
                       ) -> dict[str, dict[int, Result]]:
    """Each level runs ``reps`` waves of ``c`` concurrent requests per target, the targets
    interleaved wave by wave (rotating who goes first) so machine drift hits all alike."""
    out: dict[str, dict[int, Result]] = {name: {} for name in runners}
    names = list(runners)
    for c in levels:
        rng = random.Random(100 + c)
        waves: dict[str, list[Result]] = {name: [] for name in names}
        for rep in range(reps):
            prompts = [f"Request {rng.random():.6f}: " + text_of(rng, 70) for _ in range(c)]
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                tagged = [f"[{name}] {p}" for p in prompts]  # no reuse across targets
                waves[name].append(run_wave(runners[name], tagged, 64))
        for name in names:
            ws = waves[name]
            out[name][c] = r = Result(sum(w.wall_s for w in ws), [t for w in ws for t in w.ttfts],
                                      sum(w.tokens for w in ws))
            print(f"{name:12s} c={c:2d} {r.tok_per_s:7.1f} tok/s  TTFT mean "
                  f"{statistics.mean(r.ttfts):.3f} p50 {r.ttft(0.5):.3f} "
                  f"p99 {r.ttft(0.99):.3f}", flush=True)
    return out


def prefix_wave(name: str, runner: Runner, seed: int) -> tuple[Result, Result]:
    rng = random.Random(seed)
    prefix = f"Shared context {seed}: " + text_of(rng, 420)
    prompts = [f"{prefix}\nQuestion {i}: " + text_of(rng, 12) for i in range(8)]
    cold = run_wave(runner, prompts, 32)
    rng2 = random.Random(seed + 1)
    warm_prompts = [f"{prefix}\nQuestion {i}b: " + text_of(rng2, 12) for i in range(8)]
    warm = run_wave(runner, warm_prompts, 32)
    for label, r in (("cold", cold), ("warm", warm)):
        print(f"{name:12s} prefix wave {label}: wall {r.wall_s:.2f}s  TTFT mean "
              f"{statistics.mean(r.ttfts):.3f} p50 {r.ttft(0.5):.3f}", flush=True)
    return cold, warm


def mean(r: Result) -> float:
    return statistics.mean(r.ttfts)


def table(ref: dict, ours: dict, name: str, levels: list[int]) -> None:
    print(f"\n| load | llama-server | {name} | ratio |\n|---|---|---|---|")
    for c in levels:
        a, b = ref["levels"][c], ours["levels"][c]
        print(f"| c={c} tok/s | {a.tok_per_s:.1f} | {b.tok_per_s:.1f} | "
              f"{b.tok_per_s / a.tok_per_s:.2f}x |")
        print(f"| c={c} TTFT mean/p50/p99 s | {mean(a):.3f} / {a.ttft(0.5):.3f} / "
              f"{a.ttft(0.99):.3f} | {mean(b):.3f} / {b.ttft(0.5):.3f} / {b.ttft(0.99):.3f} | "
              f"{mean(a) / mean(b):.2f}x faster |")
    for i, label in enumerate(("cold", "warm")):
        a, b = ref["wave"][i], ours["wave"][i]
        print(f"| prefix wave {label} wall s | {a.wall_s:.2f} | {b.wall_s:.2f} | "
              f"{a.wall_s / b.wall_s:.2f}x faster |")
        print(f"| prefix wave {label} TTFT mean s | {mean(a):.3f} | {mean(b):.3f} | "
              f"{mean(a) / mean(b):.2f}x faster |")
    if "multi" in ref and "multi" in ours:
        a, b = ref["multi"], ours["multi"]
        print(f"| multi-turn later-turn TTFT mean/p99 s | {mean(a):.3f} / {a.ttft(0.99):.3f} | "
              f"{mean(b):.3f} / {b.ttft(0.99):.3f} | {mean(a) / mean(b):.2f}x faster |")
        print(f"| multi-turn wall s | {a.wall_s:.2f} | {b.wall_s:.2f} | "
              f"{a.wall_s / b.wall_s:.2f}x faster |")


def parse_args() -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser()
    p.add_argument("--n-ctx", type=int, default=8192)
    p.add_argument("--n-parallel", type=int, default=8)
    p.add_argument("--n-batch", type=int, default=2048)
    p.add_argument("--threads", type=int, default=physical_cores())
    p.add_argument("--port", type=int, default=18181)
    p.add_argument("--quick", action="store_true")
    return p.parse_args()


def main() -> None:
    """Levels of concurrency, a prefix wave and multi-turn chat on llama-server, llamapy in
    process and llamapy over HTTP; then the tables."""
    args = parse_args()
    levels = [1, 8] if args.quick else [1, 4, 8, 16]
    urls = {"llama-server": f"http://127.0.0.1:{args.port}",
            "llamapy-http": f"http://127.0.0.1:{args.port + 1}"}
    procs = [start_llama_server(args, args.port), start_llamapy_http(args, args.port + 1)]
    try:
        with Server(default_model_path(), n_ctx=args.n_ctx, n_parallel=args.n_parallel,
                    n_batch=args.n_batch, n_threads=args.threads,
                    prompt_cache_ram_mb=256) as server:
            server.wait_ready(120)
            runners = {"llama-server": llama_server_runner(urls["llama-server"]),
                       "llamapy": llamapy_runner(server),
                       "llamapy-http": llama_server_runner(urls["llamapy-http"])}
            for runner in runners.values():
                runner("warm up", 4)
            timer = TickTimer(server)
            timer.on = True
            levels_out = concurrency_levels(runners, levels)
            timer.on = False
            results: dict[str, dict] = {name: {"levels": levels_out[name]} for name in runners}
            for seed, name in enumerate(runners):
                results[name]["wave"] = prefix_wave(name, runners[name], 7 + 10 * seed)
            print(f"llamapy python share of tick time: {100 * timer.python_share:.2f}% over "
                  f"{timer.ticks} ticks")
            stats = server.stats()
            print(f"llamapy reuse: own={stats['num_reused_own']} "
                  f"donor={stats['num_reused_donor']} inflight={stats['num_reused_inflight']} "
                  f"ram={stats['num_reused_ram']}")
        for name, url in urls.items():
            results[name]["multi"] = multi_turn(name, url)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(20)
    for name in ("llamapy", "llamapy-http"):
        table(results["llama-server"], results[name], name, levels)


if __name__ == "__main__":
    main()
