"""Counts and report of ``bench/soak.py --tenants``: the good tenant's latency solo and in the
mix, each hostile request's answers, and the verdict (markdown, for ``bench/RESULTS.md``)."""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from soak_report import Tally, _fmt, percentile, rss_table, status_line, traffic_table, verdict
from soak_tenant_inputs import Hostile

#: Seconds before a slow good request in which hostile requests count as its neighbours.
NEIGHBOUR_S = 5.0


@dataclass(slots=True)
class TenantTally:
    """What a tenants run counts beyond :class:`Tally` (which holds the bad tenant's traffic,
    ``/health``, RSS and deaths). Times are seconds since ``tally.started``."""

    tally: Tally
    solo_end_s: float
    good: dict[str, Counter[str]] = field(
        default_factory=lambda: {"solo": Counter(), "mix": Counter()})
    #: phase -> (start, latency) of each whole 2xx answer.
    good_lat: dict[str, list[tuple[float, float]]] = field(
        default_factory=lambda: {"solo": [], "mix": []})
    hostile_lat: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    #: (start, end, name) of each hostile request, for the neighbours of slow good requests.
    hostile_spans: list[tuple[float, float, str]] = field(default_factory=list)
    hub_hits: list[str] = field(default_factory=list)
    slot_files: tuple[int, int] = (0, 0)

    def good_done(self, phase: str, klass: str, start_s: float, latency_s: float) -> None:
        self.good[phase][klass] += 1
        if klass.startswith("2"):
            self.good_lat[phase].append((start_s, latency_s))

    def good_non_2xx(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for counts in self.good.values():
            out.update({k: n for k, n in counts.items() if not k.startswith("2")})
        return out


def _stats(lat: list[float]) -> tuple[float | None, float | None, float | None]:
    return percentile(lat, 0.5), percentile(lat, 0.99), max(lat, default=None)


def good_table(tt: TenantTally) -> list[str]:
    """The good tenant's latency per phase with the ratios to solo, and the counts over
    2x solo p50 and 2x solo p99 in the mix."""
    solo = [x for _, x in tt.good_lat["solo"]]
    mix = [x for _, x in tt.good_lat["mix"]]
    s50, s99, _ = _stats(solo)
    lines = ["| good tenant | sent | 2xx | p50 s | p99 s | max s | p50 / solo p50 "
             "| p99 / solo p50 | max / solo p50 |", "|---" * 9 + "|"]
    for phase, lat in (("solo", solo), ("mix", mix)):
        p50, p99, top = _stats(lat)
        ratios = [_fmt(x / s50, 2) if x is not None and s50 else "-" for x in (p50, p99, top)]
        lines.append(f"| {phase} | {sum(tt.good[phase].values())} | {len(lat)} | {_fmt(p50)} | "
                     f"{_fmt(p99)} | {_fmt(top)} | " + " | ".join(ratios) + " |")
    over = {"2x solo p50": sum(x > 2 * s50 for x in mix) if s50 else 0,
            "2x solo p99": sum(x > 2 * s99 for x in mix) if s99 else 0}
    lines += ["", f"Good tenant's mix requests over 2x solo p50 ({_fmt(2 * s50) if s50 else '-'}"
              f" s): {over['2x solo p50']} of {len(mix)}; over 2x solo p99 "
              f"({_fmt(2 * s99) if s99 else '-'} s): {over['2x solo p99']}"]
    return lines


def slowest(tt: TenantTally, n: int = 5) -> list[str]:
    """The ``n`` slowest good requests of the mix, each with the hostile requests in flight
    or sent in the :data:`NEIGHBOUR_S` seconds before it."""
    lines = []
    for start, lat in sorted(tt.good_lat["mix"], key=lambda p: -p[1])[:n]:
        near = Counter(name for s, e, name in tt.hostile_spans
                       if s <= start + lat and e >= start - NEIGHBOUR_S)
        names = ", ".join(f"`{k}`" + (f" x{c}" if c > 1 else "")
                          for k, c in near.most_common(6))
        names += f" and {len(near) - 6} more" if len(near) > 6 else ""
        lines.append(f"- at {start:.0f} s: {lat:.3f} s; hostile neighbours: {names or 'none'}")
    return lines


def hostile_table(tt: TenantTally, hostile: list[Hostile]) -> tuple[list[str], int]:
    """Each hostile request's answers against those expected, with its latency; and how many
    answers were not expected."""
    lines = ["| class | hostile request | expected | sent | answers | unexpected | p50 s "
             "| max s |", "|---" * 8 + "|"]
    unexpected = 0
    for h in hostile:
        counts = tt.tally.hostile.get(h.name, Counter())
        bad = sum(n for k, n in counts.items() if not h.accepts(k))
        unexpected += bad
        p50, _, top = _stats(tt.hostile_lat.get(h.name, []))
        answers = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())) or "-"
        lines.append(f"| {h.klass} | `{h.name}` | {'/'.join(sorted(h.expected))} | "
                     f"{sum(counts.values())} | {answers} | {bad} | {_fmt(p50)} | "
                     f"{_fmt(top)} |")
    return lines, unexpected


def tenant_report(tt: TenantTally, hostile: list[Hostile], args: argparse.Namespace
                  ) -> tuple[str, bool]:
    """The whole report and whether the run passed: the good tenant got only 2xx, no 5xx
    anywhere, the Hub was never contacted, and :func:`soak_report.report`'s checks (server
    alive, ``/health`` 200, drained, RSS growth) held. ``--strict`` also fails on hostile
    answers that were not expected."""
    base, base_ok = verdict(tt.tally, args)
    good = good_table(tt)
    table, unexpected = hostile_table(tt, hostile)
    non_2xx = tt.good_non_2xx()
    any_5xx = sum(n for counts in tt.tally.outcomes.values() for k, n in counts.items()
                  if k.startswith("5"))
    files, size = tt.slot_files
    lines = [
        "- good tenant non-2xx: " + (", ".join(f"{k} x{n}" for k, n in
                                                sorted(non_2xx.items())) or "none"),
        f"- 5xx, every tenant and request: {any_5xx}",
        f"- connections to the Hub endpoint (a loopback trap): {len(tt.hub_hits)}"
        + "".join(f"\n  - `{hit}`" for hit in tt.hub_hits[:5]),
        f"- hostile answers not expected: {unexpected}"
        + (" (fails the run: --strict)" if args.strict else " (reported, not failed)"),
        f"- slot files left by the bad tenant: {files} ({size / 1e3:.0f} kB)",
    ]
    ok = base_ok and not non_2xx and not any_5xx and not tt.hub_hits and \
        not (args.strict and unexpected)
    served = "router (--models-dir, --pull-on-demand)" if args.pull_on_demand else "one model"
    head = (f"Tenants soak: solo {args.solo_seconds:g} s, then {args.minutes:g} min mixed; "
            f"good tenant 1 client, bad tenant {args.workers - 1} workers at bad rate "
            f"{args.bad_rate:g}; {served}, "
            f"n_parallel {args.n_parallel}, tenant_max_slots {args.tenant_max_slots}, "
            f"n_ctx {args.n_ctx}, seed {args.seed}")
    parts = [head, "", *good, "", "Slowest good requests of the mix:", *slowest(tt), "",
             "The bad tenant's traffic:", "", *traffic_table(tt.tally), "",
             status_line(tt.tally, hostile=False), status_line(tt.tally, hostile=True), "",
             *table, "", *rss_table(tt.tally), "", *base, *lines, "",
             f"Result: {'PASS' if ok else 'FAIL'}"]
    return "\n".join(parts), ok
