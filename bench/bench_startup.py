#!/usr/bin/env python3
"""Seconds from process start to a healthy ``/health``, and to the first streamed token of a
fresh request after it, for ``python -m llamapy.serve`` and llama-server (same build, same
settings as ``bench_http.py``), alternated A B B A ... over ``--rounds`` starts each.

``--checkout DIR`` adds a third target: ``python -m llamapy.serve`` run from another checkout
(an older commit, to measure a change in the same run). Needs ``python build_lib.py
--with-server``. Usage: ``python bench/bench_startup.py [--rounds 6] [--checkout DIR]`` (run
nothing else on the machine meanwhile).
"""

from __future__ import annotations

import argparse
import statistics

from http_load import Settings, first_token_s, llama_server_cmd, llamapy_cmd, start, stop

TARGETS = {"llama-server": llama_server_cmd, "llamapy.serve": llamapy_cmd}


def one_start(name: str, s: Settings, checkout: str | None) -> tuple[float, float]:
    """``(healthy_s, first_token_s)`` of one fresh start of ``name``."""
    cmd = TARGETS.get(name, llamapy_cmd)(s)
    proc, healthy_s = start(cmd, s.port, cwd=checkout if name == "checkout" else None)
    try:
        return healthy_s, first_token_s(s.port)
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--checkout", help="another llamapy checkout to start as a third target")
    args = parser.parse_args()
    s = Settings()
    order = [*TARGETS, *(["checkout"] if args.checkout else [])]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in order}
    for rnd in range(args.rounds):
        for name in order if rnd % 2 == 0 else order[::-1]:
            healthy, first = one_start(name, s, args.checkout)
            results[name].append((healthy, first))
            print(f"round {rnd} {name:13s} healthy {healthy:.3f} s, first token {first:.3f} s")
    base = results["llama-server"]
    for i, label in ((0, "healthy /health s"), (1, "first token s")):
        medians = {n: statistics.median(r[i] for r in rows) for n, rows in results.items()}
        print(f"{label}: " + ", ".join(f"{n} {m:.3f}" for n, m in medians.items())
              + f", ratio {medians['llamapy.serve'] / statistics.median(r[i] for r in base):.2f}")


if __name__ == "__main__":
    main()
