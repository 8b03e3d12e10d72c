"""The results of ``llama_server_suite.py``: per-test and per-file records, the per-file
table, and the comparison of two runs (``--compare``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict


class TestResult(TypedDict):
    """One test's outcome as read from pytest's junit XML."""

    file: str
    test: str
    outcome: str  # passed | failed | error | skipped
    message: str


class FileSummary(TypedDict):
    """Counts for one test file."""

    passed: int
    failed: int
    skipped: int
    error: int
    seconds: float
    note: str


def print_table(summaries: dict[str, FileSummary]) -> None:
    """Per-file counts plus totals."""
    print(f"{'file':32} {'pass':>5} {'fail':>5} {'skip':>5} {'err':>5} {'secs':>7}  note")
    tot = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for name, s in summaries.items():
        print(
            f"{name:32} {s['passed']:5} {s['failed']:5} {s['skipped']:5} {s['error']:5}"
            f" {s['seconds']:7.1f}  {s['note']}"
        )
        for k in tot:
            tot[k] += s[k]  # type: ignore[literal-required]
    print(f"{'TOTAL':32} {tot['passed']:5} {tot['failed']:5} {tot['skipped']:5} {tot['error']:5}")


def compare(base_path: Path, other_path: Path) -> None:
    """Print a markdown table of two --json outputs and the tests base passes but other fails."""
    base = json.loads(base_path.read_text())
    other = json.loads(other_path.read_text())
    bt = {(r["file"], r["test"]): r for r in base["tests"]}
    ot = {(r["file"], r["test"]): r for r in other["tests"]}
    files = list(dict.fromkeys([*base["files"], *other["files"]]))
    print(
        f"| file | {base['target']} passed/total | {other['target']} passed/total | regressions |"
    )
    print("|---|---|---|---|")
    lost: list[tuple[str, str, str]] = []
    for f in files:
        b = [r for r in base["tests"] if r["file"] == f]
        o = [r for r in other["tests"] if r["file"] == f]
        bp = sum(r["outcome"] == "passed" for r in b)
        op = sum(r["outcome"] == "passed" for r in o)
        reg = [
            k[1]
            for k, r in bt.items()
            if k[0] == f and r["outcome"] == "passed" and ot.get(k, {}).get("outcome") != "passed"
        ]
        for t in reg:
            lost.append((f, t, ot.get((f, t), {}).get("message", "(not run)")))
        print(f"| {f} | {bp}/{len(b)} | {op}/{len(o)} | {len(reg)} |")
    print()
    for f, t, msg in lost:
        print(f"- {f}::{t}: {msg}")
