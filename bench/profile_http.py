#!/usr/bin/env python3
"""CPU seconds per generated token of ``python -m llamapy.serve``, split by layer.

Per concurrency level (default 1, 4, 8, 16): waves of streaming ``/v1/completions``
(~100-token prompts, 64 tokens out, ``ignore_eos``) while

- ``/proc/<pid>/task/*/stat`` gives each thread's CPU time (user + system), and
- ``py-spy record --native --threads`` (a sampling profiler from PyPI) samples the Python
  threads; each sample is put in one layer by its innermost frame that names one.

CPU of a layer = its thread's CPU x the layer's share of that thread's samples. Threads py-spy
cannot see (ggml's worker threads) count as native decode. Needs ``pip install py-spy``.
Usage: ``python bench/profile_http.py [--levels 1,4,8,16]`` (run nothing else meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from http_load import (
    Settings,
    Wave,
    byte_compile,
    llamapy_cmd,
    prompts_for,
    start,
    stop,
    wave,
)

#: (layer, frame substring) by priority: the first rule any frame of a sample matches wins.
TICK_RULES = (
    ("native decode", "decode (llamapy/_native/context.py"),
    ("native sampling", "llamapy/_native/sampler.py"),
    ("greedy pick (numpy)", "llamapy/greedy.py"),
    ("greedy pick (numpy)", "sample (llamapy/llama_backend.py"),
    ("logprobs", "top_logprobs (llamapy/llama_backend.py"),
    ("event hand-off", "llamapy/runtime/handles.py"),
    ("batch fill", "llamapy/_native/context.py"),
    ("batch fill", "llamapy/llama_backend.py"),
    ("engine", "llamapy/engine/"),
    ("inbox", "llamapy/runtime/loop.py"),
)
LOOP_RULES = (
    ("event client", "llamapy/runtime/"),
    ("response framing", "llamapy/serve/sse.py"),
    ("response framing", "llamapy/openai_api/"),
    ("response framing", "json/"),
    ("http (uvicorn/h11)", "uvicorn/"),
    ("http (uvicorn/h11)", "h11/"),
    ("framework (starlette/anyio)", "starlette/"),
    ("framework (starlette/anyio)", "llamapy/serve/routing.py"),
    ("framework (starlette/anyio)", "anyio/"),
    ("asyncio loop", "asyncio/"),
    ("asyncio loop", "selectors.py"),
)
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: ``thread (TID): NAME;frame;...`` (py-spy ``--threads`` raw output; NAME may be missing).
_THREAD = re.compile(r"^thread \((\d+)\)(?:: ([^;]*))?;(.*)$")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of every thread of ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def classify(frames: list[str], rules: tuple[tuple[str, str], ...]) -> str:
    for frame in reversed(frames):  # innermost first
        for layer, needle in rules:
            if needle in frame:
                return layer
    return "other"


def parse_raw(path: Path) -> dict[tuple[int, str], Counter[str]]:
    """py-spy raw output -> per (tid, thread name) a Counter of layer samples."""
    out: dict[tuple[int, str], Counter[str]] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        match = _THREAD.match(stack)
        if match is None or not count.isdigit():
            continue
        tid, name = int(match[1]), match[2] or ""
        frames = match[3].split(";")
        rules = TICK_RULES if name.startswith("llamapy") else LOOP_RULES
        out[(tid, name)][classify(frames, rules)] += int(count)
    return out


def profile_level(pid: int, s: Settings, c: int, n_out: int, tag: str,
                  min_tokens: int = 768) -> dict[str, float]:
    """CPU seconds per generated token by layer over waves of ``c`` streams (at least
    ``min_tokens`` generated, so every layer gets enough samples)."""
    raw = Path(tempfile.mkdtemp()) / "spy.txt"
    spy = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--native", "--threads",
                            "--rate", "100", "--format", "raw", "--output", str(raw)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # let py-spy attach
    before = thread_cpu(pid)
    waves = [asyncio.run(wave(s.port, prompts_for(c, 1000 * k + c, tag), n_out, s.ignore_eos))
             for k in range(max(1, -(-min_tokens // (c * n_out))))]
    after = thread_cpu(pid)
    result = Wave(sum(w.wall_s for w in waves), tokens=sum(w.tokens for w in waves))
    spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    spy.wait(60)
    samples = parse_raw(raw)
    seen = {tid for tid, _ in samples}
    layers: Counter[str] = Counter()
    for (tid, name), counts in samples.items():
        cpu = after.get(tid, 0.0) - before.get(tid, 0.0)
        total = sum(counts.values())
        for layer, n in counts.items():
            layers[f"{'tick' if name.startswith('llamapy') else 'loop'}: {layer}"] += \
                cpu * n / total
    unseen = sum(after[t] - before.get(t, 0.0) for t in after if t not in seen)
    layers["ggml worker threads (native)"] += unseen
    return {k: v / max(1, result.tokens) for k, v in layers.items()} | {
        "_tok_per_s": result.tok_per_s, "_tokens": float(result.tokens)}


def report(levels: list[int], rows: dict[int, dict[str, float]]) -> None:
    keys = sorted({k for r in rows.values() for k in r if not k.startswith("_")})
    print("\n| CPU ms per generated token | " + " | ".join(f"c={c}" for c in levels) + " |")
    print("|---|" + "---|" * len(levels))
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{1e3 * rows[c].get(key, 0.0):.2f}"
                                         for c in levels) + " |")
    total = {c: sum(v for k, v in rows[c].items() if not k.startswith("_")) for c in levels}
    native = {c: sum(v for k, v in rows[c].items() if "native" in k) for c in levels}
    print("| **total** | " + " | ".join(f"**{1e3 * total[c]:.2f}**" for c in levels) + " |")
    print("| python (total - native) | " + " | ".join(
        f"{1e3 * (total[c] - native[c]):.2f}" for c in levels) + " |")
    print("| tok/s during the wave | " + " | ".join(
        f"{rows[c]['_tok_per_s']:.1f}" for c in levels) + " |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--levels", default="1,4,8,16")
    p.add_argument("--n-out", type=int, default=64)
    p.add_argument("--n-parallel", type=int, default=4)
    p.add_argument("--llamapy-dir", help="profile the llamapy of this checkout instead")
    p.add_argument("--no-ignore-eos", action="store_true", help="for llamapy without it")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    s = Settings(n_parallel=args.n_parallel, llamapy_dir=args.llamapy_dir,
                 ignore_eos=not args.no_ignore_eos)
    byte_compile(s.llamapy_dir)
    proc, healthy_s = start(llamapy_cmd(s), s.port, cwd=s.llamapy_dir)
    try:
        asyncio.run(wave(s.port, prompts_for(2, 1, "warm"), 8, s.ignore_eos))
        rows = {c: profile_level(proc.pid, s, c, args.n_out, "profile") for c in levels}
    finally:
        stop(proc)
    print(f"healthy after {healthy_s:.2f} s")
    report(levels, rows)


if __name__ == "__main__":
    main()
