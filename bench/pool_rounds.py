#!/usr/bin/env python3
"""Pool the rounds of several ``bench_http.py --resident`` runs into one paired statistic.

Each argument is ``FILE:START-END``, a line range of a markdown file holding one run's table
(as ``bench_http.py`` prints it and RESULTS.md keeps it): rows ``| streams | llama-server
rounds | llamapy rounds | ...`` with the rounds separated by `` / ``. Per run and over all
runs, per level: the geometric mean of the per-round ratios (llamapy / llama-server, each
round's two waves ran next to each other, so drift between rounds cancels), its standard
error, and the rounds llamapy won. Usage: ``python bench/pool_rounds.py
bench/RESULTS.md:836-840 bench/RESULTS.md:858-862 ...``.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path


def run_ratios(spec: str) -> dict[int, list[float]]:
    """Per level, the ratio of each round of the table at ``FILE:START-END``."""
    path, _, span = spec.rpartition(":")
    start, _, end = span.partition("-")
    lines = Path(path).read_text().splitlines()[int(start) - 1:int(end)]
    out: dict[int, list[float]] = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit() or " / " not in cells[1]:
            continue
        a = [float(x) for x in cells[1].split(" / ")]
        b = [float(x) for x in cells[2].split(" / ")]
        if len(a) != len(b):
            raise SystemExit(f"{spec}: level {cells[0]} has {len(a)} and {len(b)} rounds")
        out[int(cells[0])] = [y / x for x, y in zip(a, b, strict=True) if x and y]
    if not out:
        raise SystemExit(f"{spec}: no table rows with rounds")
    return out


def summary(ratios: list[float]) -> str:
    logs = [math.log(r) for r in ratios]
    mean = math.exp(statistics.mean(logs))
    se = mean * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0.0
    return f"{mean:.3f} ± {se:.3f} ({sum(r > 1 for r in ratios)}/{len(ratios)} won)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tables", nargs="+", help="FILE:START-END of one run's table")
    args = p.parse_args()
    runs = [run_ratios(spec) for spec in args.tables]
    pooled: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        for level, ratios in run.items():
            pooled[level] += ratios
    heads = [f"run {i + 1}" for i in range(len(runs))]
    print("| streams | " + " | ".join(heads) + " | all rounds |")
    print("|---" * (len(runs) + 2) + "|")
    for level in sorted(pooled):
        cells = [summary(run[level]) if level in run else "-" for run in runs]
        print(f"| {level} | " + " | ".join(cells) + f" | {summary(pooled[level])} |")


if __name__ == "__main__":
    main()
