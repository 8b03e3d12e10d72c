#!/usr/bin/env python3
"""Time to first token of the first request after a restart, on a 2,000-token prefix.

Three cases, each a fresh server process with its serving defaults, the same settings as
``http_load.Settings`` (1 slot here) and the same measured request (a shared ~2,000-token
system text plus a new question, streamed ``/v1/completions``, greedy):

- **cold**: ``python -m llamapy.serve --prompt-cache-dir EMPTY``: nothing to reuse;
- **disk-warm**: a server on the same folder answers a request on the prefix (another
  question), is stopped (SIGTERM: at close it writes its slot and RAM cache to disk) and
  restarted; the measured request is the new server's first. The cache files are dropped from
  the OS page cache before the restart (``posix_fadvise DONTNEED``, after ``fsync``), so the
  restore reads the disk, not memory (``--keep-page-cache`` skips that);
- **llama-server restarted**: the same priming request, a restart, the measured request: its
  RAM prompt cache starts empty, so this is llama-server's cold start.

Reported: TTFT per case (median over rounds), the server's own ``timings`` (``cache_n``:
reused tokens, ``prompt_n``: computed ones) and the cold / disk-warm ratio (goal >= 5x).

Usage: ``python bench/bench_disk_cache.py [--rounds 3] [--prefix-tokens 2000]`` with nothing
else running; ``--smoke`` runs one round of a 200-token prefix (a check, not a measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from http_load import Settings, llama_server_cmd, llamapy_cmd, start, stop, text_of

SUFFIX = ".lpkv"
#: ``python -m llamapy.serve`` runs from this checkout (not whatever llamapy is installed).
REPO = str(Path(__file__).resolve().parents[1])


async def first_token(port: int, prompt: str) -> tuple[float, dict]:
    """Seconds to the first streamed token of ``prompt``, and the final ``timings``."""
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0.0, "stream": True}
    t0, ttft, timings = time.perf_counter(), 0.0, {}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client, \
            client.stream("POST", "/v1/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            timings = data.get("timings") or timings
            choices = data.get("choices") or []
            if choices and choices[0].get("text") is not None and not ttft:
                ttft = time.perf_counter() - t0
    return ttft, timings


def prompts(prefix_tokens: int, seed: int) -> tuple[str, str]:
    """A priming and a measured prompt sharing a ~``prefix_tokens`` system text."""
    rng = random.Random(seed)
    system = f"System {seed}: " + text_of(rng, prefix_tokens)
    return (system + "\nQuestion: " + text_of(rng, 12) + "\nAnswer:",
            system + "\nQuestion: " + text_of(rng, 12) + "\nAnswer:")


def drop_page_cache(folder: Path) -> int:
    """Evict the cache files from the OS page cache (after writing them back); bytes."""
    total = 0
    for path in folder.glob("*" + SUFFIX):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def measure(cmd: list[str], port: int, prompt: str, prime: str | None,
            between: Callable[[], None] = lambda: None) -> tuple[float, dict]:
    """TTFT of ``prompt`` as the first request of a fresh server (after ``prime`` on a server
    that was then stopped, if given)."""
    if prime is not None:
        proc, _ = start(cmd, port, cwd=REPO)
        try:
            asyncio.run(first_token(port, prime))
        finally:
            stop(proc)
        between()
    proc, _ = start(cmd, port, cwd=REPO)
    try:
        return asyncio.run(first_token(port, prompt))
    finally:
        stop(proc)


def one_round(s: Settings, rnd: int, prefix_tokens: int, keep_cache: bool
              ) -> dict[str, tuple[float, dict]]:
    """The three cases once, on fresh folders (llama-server only where it was built)."""
    prime, prompt = prompts(prefix_tokens, 100 + rnd)
    out = {}
    with tempfile.TemporaryDirectory(prefix="llamapy-disk-bench-") as tmp:
        cold_dir, warm_dir = Path(tmp, "cold"), Path(tmp, "warm")
        llamapy = llamapy_cmd(s)
        out["cold"] = measure([*llamapy, "--prompt-cache-dir", str(cold_dir)], s.port, prompt,
                              None)
        dropped = {"bytes": 0}

        def evict() -> None:
            """Between the priming server and the measured one: out of the page cache."""
            if not keep_cache:
                dropped["bytes"] = drop_page_cache(warm_dir)

        out["disk-warm"] = measure([*llamapy, "--prompt-cache-dir", str(warm_dir)], s.port,
                                   prompt, prime, evict)
        out["disk-warm"][1]["cache_file_bytes"] = dropped["bytes"]
    if shutil.which(llama_server_cmd(s)[0]) or Path(llama_server_cmd(s)[0]).exists():
        out["llama-server restarted"] = measure(llama_server_cmd(s), s.port, prompt, prime)
    return out


def main() -> None:
    """Run the rounds and print the table."""
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prefix-tokens", type=int, default=2000)
    p.add_argument("--keep-page-cache", action="store_true")
    p.add_argument("--smoke", action="store_true", help="1 round, 200-token prefix")
    args = p.parse_args()
    rounds, prefix = (1, 200) if args.smoke else (args.rounds, args.prefix_tokens)
    s = Settings(n_ctx=4096, n_parallel=1, n_batch=2048)
    runs: dict[str, list[tuple[float, dict]]] = {}
    for rnd in range(rounds):
        for name, (ttft, timings) in one_round(s, rnd, prefix, args.keep_page_cache).items():
            runs.setdefault(name, []).append((ttft, timings))
            files = timings.get("cache_file_bytes")
            print(f"round {rnd} {name:22s} TTFT {ttft:.3f}s  cache_n {timings.get('cache_n')}"
                  f"  prompt_n {timings.get('prompt_n')}"
                  + (f"  cache files {files / 1e6:.1f} MB" if files else ""), flush=True)
    print("\n| first request after a restart | TTFT s (median) | reused | computed |")
    print("|---|---|---|---|")
    med = {name: statistics.median(t for t, _ in r) for name, r in runs.items()}
    for name, r in runs.items():
        timings = r[-1][1]
        print(f"| {name} | {med[name]:.3f} | {timings.get('cache_n')} | "
              f"{timings.get('prompt_n')} |")
    if "cold" in med and med.get("disk-warm"):
        print(f"\ncold / disk-warm: {med['cold'] / med['disk-warm']:.1f}x (goal >= 5x)")
    if med.get("disk-warm") and "llama-server restarted" in med:
        print(f"llama-server restarted / disk-warm: "
              f"{med['llama-server restarted'] / med['disk-warm']:.1f}x")


if __name__ == "__main__":
    main()
