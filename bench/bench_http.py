#!/usr/bin/env python3
"""``python -m llamapy.serve`` against llama-server (same build), one server at a time.

Each round starts one target, measures seconds to a healthy ``/health`` and to the first
streamed token, runs one wave per concurrency level (default 1, 4, 8, 16, 32 streams of
~100-token prompts, 64 tokens out, greedy, ``ignore_eos``), and stops it; the next round
starts the other target first (A B B A ...), so drift of the shared machine hits both. Every
round is printed, then the medians and ratios. Settings mirror each other: ``-c``/``--n-ctx``,
``-np``/``--n-parallel``, ``-b``/``--n-batch``, ``-t``/``--threads``.

``--resident`` starts both servers once, side by side, and alternates their waves level by
level (A B, then B A): an idle server blocks (no CPU; the CPU each server used while the other
ran is printed), and the shared machine's drift over minutes, which moved one stream's token
gap by 15% between consecutive runs here, then falls on both targets alike.

``--serial N`` makes the one-stream level N requests one after another (still one stream at
a time): a single 64-token request is too short a measurement on a noisy machine.

Needs ``python build_lib.py --with-server``. Usage:
``python bench/bench_http.py [--rounds 2] [--levels 1,4,8,16,32] [--n-parallel 4]
[--resident] [--serial 8]`` (run nothing else on the machine meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from http_load import (
    Settings,
    Wave,
    byte_compile,
    first_token_s,
    llama_server_cmd,
    llamapy_cmd,
    prompts_for,
    serial_wave,
    start,
    stop,
    wave,
)

TARGETS = {"llama-server": llama_server_cmd, "llamapy.serve": llamapy_cmd}


def run_target(name: str, s: Settings, levels: list[int], n_out: int, rnd: int,
               serial: int = 1) -> tuple[float, float, dict[int, Wave]]:
    proc, healthy_s = start(TARGETS[name](s), s.port)
    try:
        first_s = first_token_s(s.port)
        asyncio.run(wave(s.port, prompts_for(2, 7, f"warm {name}"), 8))
        out = {}
        for c in levels:
            out[c] = w = one_wave(s.port, c, 100 * rnd + c, name, n_out, serial)
            print(f"round {rnd} {name:13s} c={c:2d} {w.tok_per_s:6.1f} tok/s  TTFT p50 "
                  f"{w.ttft(0.5):.3f} p99 {w.ttft(0.99):.3f}", flush=True)
    finally:
        stop(proc)
    print(f"round {rnd} {name:13s} healthy after {healthy_s:.2f} s, first token "
          f"{first_s:.3f} s", flush=True)
    return healthy_s, first_s, out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_wave(port: int, c: int, seed: int, tag: str, n_out: int, serial: int) -> Wave:
    """The wave of level ``c``: ``c`` concurrent streams, or at c=1 ``serial`` in a row."""
    if c == 1 and serial > 1:
        return asyncio.run(serial_wave(port, prompts_for(serial, seed, tag), n_out))
    return asyncio.run(wave(port, prompts_for(c, seed, tag), n_out))


def run_resident(s: Settings, levels: list[int], n_out: int, rounds: int, serial: int = 1
                 ) -> dict[str, list[tuple[float, float, dict[int, Wave]]]]:
    """Both targets up at once; each level's waves alternate between them."""
    ports = {name: s.port + i for i, name in enumerate(TARGETS)}
    procs = {name: start(TARGETS[name](replace(s, port=port)), port)[0]
             for name, port in ports.items()}
    runs: dict[str, list[tuple[float, float, dict[int, Wave]]]] = defaultdict(list)
    idle_cpu = dict.fromkeys(TARGETS, 0.0)
    try:
        for name, port in ports.items():
            asyncio.run(wave(port, prompts_for(2, 7, f"warm {name}"), 8))
        for rnd in range(rounds):
            out: dict[str, dict[int, Wave]] = defaultdict(dict)
            for i, c in enumerate(levels):
                order = list(TARGETS) if (rnd + i) % 2 == 0 else list(TARGETS)[::-1]
                for name in order:
                    other = next(n for n in TARGETS if n != name)
                    before = cpu_s(procs[other].pid)
                    w = one_wave(ports[name], c, 100 * rnd + c, name, n_out, serial)
                    idle_cpu[other] += cpu_s(procs[other].pid) - before
                    out[name][c] = w
                    print(f"round {rnd} {name:13s} c={c:2d} {w.tok_per_s:6.1f} tok/s  TTFT p50 "
                          f"{w.ttft(0.5):.3f} p99 {w.ttft(0.99):.3f}", flush=True)
            for name in TARGETS:
                runs[name].append((0.0, 0.0, out[name]))
    finally:
        for proc in procs.values():
            stop(proc)
    print("CPU s each server used while the other ran: "
          + ", ".join(f"{n} {v:.2f}" for n, v in idle_cpu.items()), flush=True)
    return runs


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def geo_mean(ratios: list[float]) -> str:
    """The geometric mean of paired ratios and its standard error (drift between rounds
    cancels within a pair; pool several runs' rounds the same way)."""
    if len(ratios) < 2:
        return "-"
    logs = [math.log(r) for r in ratios]
    mean, se = statistics.mean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    return f"{math.exp(mean):.3f} ± {math.exp(mean) * se:.3f}"


def report(levels: list[int], runs: dict[str, list[tuple[float, float, dict[int, Wave]]]]
           ) -> None:
    a, b = runs["llama-server"], runs["llamapy.serve"]
    print("\n| streams | llama-server tok/s (rounds) | llamapy.serve tok/s (rounds) | "
          "ratio (medians) | ratio (median of rounds) | geometric mean of rounds | "
          "rounds won | TTFT p99 llama-server / llamapy |")
    print("|---|---|---|---|---|---|---|---|")
    for c in levels:
        xa = [r[2][c].tok_per_s for r in a]
        xb = [r[2][c].tok_per_s for r in b]
        ratios = [y / x for x, y in zip(xa, xb, strict=True) if x and y]
        pa = median([r[2][c].ttft(0.99) for r in a])
        pb = median([r[2][c].ttft(0.99) for r in b])
        print(f"| {c} | {' / '.join(f'{x:.1f}' for x in xa)} | "
              f"{' / '.join(f'{x:.1f}' for x in xb)} | {median(xb) / median(xa):.2f} | "
              f"{median(ratios):.3f} | {geo_mean(ratios)} | "
              f"{sum(r > 1 for r in ratios)}/{len(ratios)} | {pa:.3f} / {pb:.3f} |")
    for label, pick in (("healthy /health s", lambda r: r[0]), ("first token s", lambda r: r[1])):
        xa, xb = [pick(r) for r in a], [pick(r) for r in b]
        if not any(xa):  # --resident measures no start
            continue
        print(f"| {label} | {' / '.join(f'{x:.2f}' for x in xa)} | "
              f"{' / '.join(f'{x:.2f}' for x in xb)} | {median(xb) / median(xa):.2f} | |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--levels", default="1,4,8,16,32")
    p.add_argument("--n-out", type=int, default=64)
    p.add_argument("--n-parallel", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--resident", action="store_true",
                   help="both servers up at once, waves alternated level by level")
    p.add_argument("--serial", type=int, default=1,
                   help="requests one after another in the one-stream wave (default 1)")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    s = Settings(n_parallel=args.n_parallel, threads=args.threads)
    byte_compile()
    if args.resident:
        report(levels, run_resident(s, levels, args.n_out, args.rounds, args.serial))
        return
    runs: dict[str, list] = defaultdict(list)
    order = list(TARGETS)
    for rnd in range(args.rounds):
        for name in (order if rnd % 2 == 0 else order[::-1]):
            runs[name].append(run_target(name, s, levels, args.n_out, rnd, args.serial))
    report(levels, runs)


if __name__ == "__main__":
    main()
