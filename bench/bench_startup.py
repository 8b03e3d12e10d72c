#!/usr/bin/env python3
"""Seconds from process start to a healthy ``/health``, and to the first streamed token of a
fresh request after it, for ``python -m llamapy.serve`` and llama-server (same build, same
settings as ``bench_http.py``), alternated A B B A ... over ``--rounds`` starts each.

``--checkout DIR`` adds a third target: ``python -m llamapy.serve`` run from another checkout
(an older commit, to measure a change in the same run). Needs ``python build_lib.py
--with-server``. Usage: ``python bench/bench_startup.py [--rounds 6] [--checkout DIR]`` (run
nothing else on the machine meanwhile).

Both checkouts' ``llamapy`` is byte-compiled first (``compileall``), as an installed package
is: where ``PYTHONDONTWRITEBYTECODE`` is set (this sandbox sets it), every start would
otherwise compile ~170 modules from source, ~0.15 s that no installed copy pays.
``--no-compile`` measures without it. Both servers run their warm-up decode before they
report healthy (llama-server's default); ``--no-warmup`` starts both without it.
"""

from __future__ import annotations

import argparse
import statistics

from http_load import (
    Settings,
    byte_compile,
    first_token_s,
    llama_server_cmd,
    llamapy_cmd,
    start,
    stop,
)

TARGETS = {"llama-server": llama_server_cmd, "llamapy.serve": llamapy_cmd}


def one_start(name: str, s: Settings, checkout: str | None, extra: list[str]
              ) -> tuple[float, float]:
    """``(healthy_s, first_token_s)`` of one fresh start of ``name`` (``extra``: more flags)."""
    cmd = TARGETS.get(name, llamapy_cmd)(s) + extra
    proc, healthy_s = start(cmd, s.port, cwd=checkout if name == "checkout" else None)
    try:
        return healthy_s, first_token_s(s.port)
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--checkout", help="another llamapy checkout to start as a third target")
    parser.add_argument("--no-compile", action="store_true",
                        help="do not byte-compile the checkouts first")
    parser.add_argument("--no-warmup", action="store_true",
                        help="start every target with --no-warmup (llama-server's flag; both "
                             "warm up by default)")
    args = parser.parse_args()
    extra = ["--no-warmup"] if args.no_warmup else []
    if not args.no_compile:
        for checkout in (None, *([args.checkout] if args.checkout else [])):
            byte_compile(checkout)
    s = Settings()
    order = [*TARGETS, *(["checkout"] if args.checkout else [])]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in order}
    for rnd in range(args.rounds):
        for name in order if rnd % 2 == 0 else order[::-1]:
            healthy, first = one_start(name, s, args.checkout, extra)
            results[name].append((healthy, first))
            print(f"round {rnd} {name:13s} healthy {healthy:.3f} s, first token {first:.3f} s")
    base = results["llama-server"]
    for i, label in ((0, "healthy /health s"), (1, "first token s")):
        medians = {n: statistics.median(r[i] for r in rows) for n, rows in results.items()}
        print(f"{label}: " + ", ".join(f"{n} {m:.3f}" for n, m in medians.items())
              + f", ratio {medians['llamapy.serve'] / statistics.median(r[i] for r in base):.2f}")


if __name__ == "__main__":
    main()
