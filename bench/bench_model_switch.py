#!/usr/bin/env python3
"""Model switch latency: a request for a model that is not loaded, when only one fits.

Both servers serve a folder with SmolLM2-135M and Gemma 3 270M with one model loaded at a time
(``--models-dir DIR --models-max 1``): ``python -m llamapy.serve`` (its ModelManager) and
llama-server in router mode (same build, ``build_lib.py --with-server``). Requests alternate
A, B, A, B, ... (each one unloads the other model and loads its own) with a few warm repeats in
between; reported per target: the wall time of a one-token chat completion that has to load
its model (a *switch*) and of one on a loaded model (*warm*), median and range, plus the
servers' start time. Each server runs alone; rounds alternate the order.

Usage: ``python bench/bench_model_switch.py [--rounds 2] [--switches 6]`` (nothing else on the
machine; needs ``python -m llamapy.models fetch --all``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from http_load import start, stop

from llamapy._paths import current_build
from llamapy.models import default_model_path, second_model_path

PORT = 18231


def commands(folder: Path) -> dict[str, list[str]]:
    """Each target's command line on ``folder`` (one model at a time, 2 threads, 1 slot)."""
    common = ["--models-dir", str(folder), "--models-max", "1", "-c", "2048", "-np", "1",
              "-t", "2", "--port", str(PORT), "--host", "127.0.0.1"]
    build = current_build()
    assert build, "run python build_lib.py --with-server"
    return {"llamapy.serve": [sys.executable, "-m", "llamapy.serve", *common],
            "llama-server": [str(Path(build["lib_dir"]) / "llama-server"), *common]}


def ask(http: httpx.Client, model: str) -> float:
    """Seconds for a one-token greedy chat completion on ``model``."""
    started = time.perf_counter()
    done = http.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
        "temperature": 0}, timeout=300)
    done.raise_for_status()
    return time.perf_counter() - started


def model_ids(http: httpx.Client) -> list[str]:
    """The two served model ids, in a stable order."""
    ids = sorted(m["id"] for m in http.get("/v1/models").json()["data"])
    assert len(ids) == 2, ids
    return ids


def run(name: str, cmd: list[str], switches: int) -> dict[str, list[float]]:
    """One server's switch and warm latencies."""
    proc, start_s = start(cmd, PORT)
    out: dict[str, list[float]] = {"switch": [], "warm": [], "start": [start_s]}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}") as http:
            first, second = model_ids(http)
            ask(http, first)  # the first load is not a switch
            for i in range(switches):
                model = second if i % 2 == 0 else first
                out["switch"].append(ask(http, model))
                out["warm"] += [ask(http, model) for _ in range(2)]
    finally:
        stop(proc)
    print(f"  {name:14s} switch {statistics.median(out['switch']):.3f} s  "
          f"warm {statistics.median(out['warm']):.3f} s  start {start_s:.2f} s", flush=True)
    return out


def report(results: dict[str, dict[str, list[float]]]) -> None:
    print("\n| target | switch s (median, min-max) | warm s (median) | start s |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {statistics.median(r['switch']):.3f} ({min(r['switch']):.3f}-"
              f"{max(r['switch']):.3f}) | {statistics.median(r['warm']):.3f} | "
              f"{statistics.median(r['start']):.2f} |")
    a, b = (statistics.median(results[n]["switch"]) for n in ("llamapy.serve", "llama-server"))
    print(f"\nswitch latency llamapy / llama-server: {a / b:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--switches", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for path in (default_model_path(), second_model_path()):
            (folder / path.name).symlink_to(path)
        cmds = commands(folder)
        results: dict[str, dict[str, list[float]]] = {n: {"switch": [], "warm": [], "start": []}
                                                      for n in cmds}
        for rnd in range(args.rounds):
            print(f"round {rnd}")
            for name in (list(cmds) if rnd % 2 == 0 else list(cmds)[::-1]):
                for key, values in run(name, cmds[name], args.switches).items():
                    results[name][key] += values
        report(results)


if __name__ == "__main__":
    main()
