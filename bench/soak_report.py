"""Counts of ``bench/soak.py`` and its report (markdown tables for ``bench/RESULTS.md``)."""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from soak_inputs import Req

#: Outcome classes besides HTTP statuses, in table order.
NON_HTTP = ("connection error", "timeout", "dropped", "unfinished")


def outcome(status: int | None, error: str | None) -> str:
    """An outcome class: the HTTP status, ``connection error``, ``timeout``, or ``dropped``
    (a hang-up that left before any answer); ``unfinished`` (in flight when a stopped server
    ended the run) is counted apart."""
    return error or (str(status) if status is not None else "dropped")


@dataclass(frozen=True, slots=True)
class Death:
    """The server stopped: when, its exit status (None: alive), its last ``/health`` status
    (None: no answer), and the hostile bodies sent since its last healthy ``/health``."""

    at_s: float
    returncode: int | None
    health: int | None
    suspects: list[str]


@dataclass(slots=True)
class Tally:
    """Everything a soak run counts."""

    started: float
    warmup_s: float
    outcomes: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    hostile: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    latencies: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    valid_5xx: Counter[str] = field(default_factory=Counter)
    rss: list[tuple[float, float]] = field(default_factory=list)
    deaths: list[Death] = field(default_factory=list)
    health_checks: int = 0
    restarts: int = 0
    health_bad: Counter[str] = field(default_factory=Counter)
    stopped: bool = False
    alive_at_end: bool = False
    drained: bool = False
    failure_suspects: list[str] | None = None
    _inflight: dict[int, str] = field(default_factory=dict)
    _sent: list[tuple[float, str]] = field(default_factory=list)
    _next_token: int = 0

    def begin(self, name: str) -> int:
        """A hostile request ``name`` starts; its token for :meth:`end`."""
        self._next_token += 1
        self._inflight[self._next_token] = name
        self._sent.append((time.monotonic(), name))
        return self._next_token

    def end(self, token: int | None) -> None:
        if token is not None:
            self._inflight.pop(token, None)

    def count(self, req: Req, klass: str, latency_s: float, is_hostile: bool) -> None:
        """One finished request: its outcome, and its latency when valid, whole and 2xx."""
        self.outcomes["hostile" if is_hostile else req.kind][klass] += 1
        if is_hostile:
            self.hostile[req.kind][klass] += 1
            return
        if klass.startswith("5"):
            self.valid_5xx[req.kind] += 1
        if klass.startswith("2") and req.mode in ("post", "stream"):
            self.latencies[req.kind].append(latency_s)

    def health(self, status: int | None) -> None:
        """One ``/health`` check; a 200 clears the suspects sent more than 2 s before it."""
        self.health_checks += 1
        if status == 200:
            horizon = time.monotonic() - 2.0
            self._sent = [(t, name) for t, name in self._sent if t >= horizon]
        else:
            self.health_bad[str(status) if status is not None else "no answer"] += 1

    def suspects(self) -> list[str]:
        """Hostile bodies in flight or sent since (about) the last healthy ``/health``."""
        return sorted({name for _, name in self._sent} | set(self._inflight.values()))

    def mark_failure(self) -> None:
        """The first sign of a stopped server since the last healthy ``/health``: keep the
        suspects as they are now (later requests only meet the stopped server)."""
        if self.failure_suspects is None:
            self.failure_suspects = self.suspects()

    def clear_failure(self) -> None:
        self.failure_suspects = None

    def reset_suspects(self) -> None:
        """After a restart: nothing sent so far is a suspect any more."""
        self._sent.clear()
        self.failure_suspects = None


def percentile(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not xs:
        return None
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _classes(counts: Counter[str]) -> dict[str, int]:
    out = Counter({"2xx": 0, "4xx": 0, "5xx": 0, **dict.fromkeys(NON_HTTP, 0)})
    for klass, n in counts.items():
        out[f"{klass[0]}xx" if klass[0].isdigit() else klass] += n
    return out


def traffic_table(tally: Tally) -> list[str]:
    """Requests by kind and outcome class, with latency of the valid 2xx answers."""
    cols = ["2xx", "4xx", "5xx", *NON_HTTP]
    lines = ["| traffic | sent | " + " | ".join(cols) + " | p50 s | p99 s |",
             "|---" * (len(cols) + 4) + "|"]
    for kind in sorted(tally.outcomes, key=lambda k: (k == "hostile", k)):
        counts, lat = _classes(tally.outcomes[kind]), tally.latencies.get(kind, [])
        lines.append(f"| {kind} | {sum(counts.values())} | "
                     + " | ".join(str(counts[c]) for c in cols)
                     + f" | {_fmt(percentile(lat, 0.5))} | {_fmt(percentile(lat, 0.99))} |")
    every = [x for kind, xs in tally.latencies.items() for x in xs]
    cells = ["all valid (whole answers)", str(len(every)), *[""] * len(cols),
             _fmt(percentile(every, 0.5)), _fmt(percentile(every, 0.99))]
    lines.append("| " + " | ".join(cells) + " |")
    return lines


def status_line(tally: Tally, hostile: bool) -> str:
    """The 4xx and 5xx answers by status, for the valid or the hostile requests."""
    counts: Counter[str] = Counter()
    for kind, outcomes in tally.outcomes.items():
        if (kind == "hostile") == hostile:
            counts.update({k: n for k, n in outcomes.items() if k[0] in "45"})
    label = "hostile" if hostile else "valid"
    text = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())) or "none"
    return f"4xx/5xx by status, {label}: {text}"


def hostile_table(tally: Tally) -> list[str]:
    """Each hostile body's answers."""
    lines = ["| hostile body | sent | answers |", "|---|---|---|"]
    for name in sorted(tally.hostile):
        counts = tally.hostile[name]
        answers = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
        lines.append(f"| `{name}` | {sum(counts.values())} | {answers} |")
    return lines


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of RSS over time, MB a minute (None under two samples)."""
    if len(samples) < 2:
        return None
    n = len(samples)
    mt, mr = sum(t for t, _ in samples) / n, sum(r for _, r in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    cov = sum((t - mt) * (r - mr) for t, r in samples)
    return 60.0 * cov / var if var else None


def rss_growth(tally: Tally) -> tuple[float | None, float | None]:
    """RSS growth (last minus the first sample after warm-up) and slope after warm-up."""
    after = [(t, r) for t, r in tally.rss if t >= tally.warmup_s]
    if not after:
        return None, None
    return tally.rss[-1][1] - after[0][1], slope_mb_per_min(after)


def rss_table(tally: Tally) -> list[str]:
    rss = [r for _, r in tally.rss]
    growth, slope = rss_growth(tally)
    first, last = (rss[0], rss[-1]) if rss else (None, None)
    restarts = f" ({tally.restarts + 1} server processes)" if tally.restarts else ""
    return [f"| RSS MB{restarts}: first | min | max | last | growth after warm-up "
            "| slope after warm-up MB/min | samples |", "|---|---|---|---|---|---|---|",
            f"| {_fmt(first, 1)} | {_fmt(min(rss, default=None), 1)} | "
            f"{_fmt(max(rss, default=None), 1)} | {_fmt(last, 1)} | {_fmt(growth, 1)} | "
            f"{_fmt(slope, 2)} | {len(rss)} |"]


def verdict(tally: Tally, args: argparse.Namespace) -> tuple[list[str], bool]:
    """The pass/fail lines and whether the run passed."""
    growth, _ = rss_growth(tally)
    bad = ", ".join(f"{k} x{n}" for k, n in sorted(tally.health_bad.items()))
    lines = [f"- /health: {tally.health_checks} checks, "
             + (f"not 200: {bad}" if bad else "all 200"),
             f"- server alive at the end: {'yes' if tally.alive_at_end else 'no'}; "
             f"stopped {len(tally.deaths)} time(s)"]
    for d in tally.deaths:
        how = f"exited {d.returncode}" if d.returncode is not None else \
            f"alive, /health {d.health if d.health is not None else 'no answer'}"
        lines.append(f"  - at {d.at_s:.0f} s ({how}); hostile bodies since its last healthy "
                     f"/health: {', '.join(f'`{s}`' for s in d.suspects) or 'none'}")
    lines.append(f"- slots idle and a chat answered after the traffic: "
                 f"{'yes' if tally.drained else 'no'}")
    lines.append("- 5xx on valid requests: " + (", ".join(
        f"{k} x{n}" for k, n in sorted(tally.valid_5xx.items())) or "none"))
    grew = growth is not None and growth > args.max_rss_growth_mb
    lines.append(f"- RSS growth after warm-up: {_fmt(growth, 1)} MB (limit "
                 f"{args.max_rss_growth_mb:.0f} MB)")
    ok = (not tally.deaths and tally.alive_at_end and tally.drained and not tally.valid_5xx
          and not grew)
    return lines, ok


def report(tally: Tally, args: argparse.Namespace) -> tuple[str, bool]:
    """The whole report (markdown) and whether the run passed."""
    head = (f"Soak: {args.minutes:g} min, {args.workers} workers, bad rate {args.bad_rate:g}, "
            f"n_parallel {args.n_parallel}, n_ctx {args.n_ctx}, seed {args.seed}")
    lines, ok = verdict(tally, args)
    parts = [head, "", *traffic_table(tally), "", status_line(tally, hostile=False),
             status_line(tally, hostile=True), "", *hostile_table(tally), "", *rss_table(tally),
             "", *lines, "", f"Result: {'PASS' if ok else 'FAIL'}"]
    return "\n".join(parts), ok
