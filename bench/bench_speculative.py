#!/usr/bin/env python3
"""Speculative decoding: ``python -m llamapy.serve`` with and without n-gram drafts, and
llama-server from the same build with and without its ``ngram-mod``.

Two prompt classes (``bench/spec_prompts.py``), chat requests (non-streaming
``/v1/chat/completions``, greedy, up to ``--max-tokens`` out, every server stops at EOS so
completion lengths are reported):

- (a) input-grounded: rewrite a Python snippet from this repo with one identifier renamed
  (twice, two snippets), quote a paragraph back with two words changed, reproduce a JSON config
  with one value changed: the answer mostly copies the prompt, which is what n-gram drafts
  predict;
- (b) open-ended: a story, an explanation, a list of ideas, an essay: little to copy.

Four targets, each started alone (a fresh process per target and stream count, so no n-gram
pool or prompt cache carries over from a previous phase; one short warm-up request first), in
alternating order across rounds: ``llamapy-off`` (``--spec-type off``), ``llamapy-ngram``
(``--spec-type ngram``), ``llama-server-off`` and ``llama-server-ngram`` (``--spec-type
ngram-mod`` with llama.cpp's recommended config, the one ``--spec-default`` enables:
``--spec-ngram-mod-n-match 24 --spec-ngram-mod-n-min 48 --spec-ngram-mod-n-max 64``). All get
the model, ``-c``, ``-np`` 4, 2 threads and ``n_batch`` of :class:`http_load.Settings`.

Measured per target x class x stream count: tok/s = completion tokens / wall time (1 stream:
the prompts one after another, each request's wall time summed; N streams: the prompts in
waves of N concurrent requests, each wave's wall time summed), the server-reported decode rate
(``timings.predicted_n`` / ``predicted_ms``, per stream), mean completion tokens per request,
and draft acceptance (``timings.draft_n_accepted`` / ``draft_n``) where the server reports it.
Ratios are taken per round (same round, same machine state), then the median and min-max over
rounds: ngram/off for each server, llamapy-ngram / llama-server-ngram. The issue's goals are
checked on the medians: >= 1.8x ngram/off on (a) at one stream, >= 1.0x llama-server-ngram on
(a) and (b), (b) ngram/off never below 0.95. Greedy output must not change with speculation:
the 1-stream texts of off and ngram are compared per prompt and round and the mismatches
counted (a correctness signal, reported, not a failure).

``--n-max N`` passes ``--spec-draft-n-max N`` to both servers; llama-server's ``ngram-mod``
ignores that flag (it only bounds a draft model), so it also gets ``--spec-ngram-mod-n-max N``
and ``--spec-ngram-mod-n-min 3N/4`` (the recommended 48/64 ratio). ``--llama-server-spec`` and
``--llamapy-spec`` replace / extend the speculative flags of the ngram targets.

Usage (nothing else running on the machine; needs ``python build_lib.py --with-server``)::

    PYTHONPATH=. python bench/bench_speculative.py [--rounds 3] [--max-tokens 256]
        [--streams 1,4] [--targets llamapy-off,llamapy-ngram,...] [--n-max 16]
        [--prompts code-decodecost,story] [--llamapy-dir ../other-checkout]

Each class has 4 prompts, so a 4-stream wave is 4 distinct requests; ``--prompts`` with fewer
is for smoke runs (a wave then repeats prompts and its figures mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from http_load import Settings, llama_server_cmd, llamapy_cmd, start, stop
from spec_prompts import PROMPTS, Prompt

#: llama-server's n-gram mode: ``ngram-mod`` as ``--spec-default`` configures it.
LLAMA_SERVER_SPEC = ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24",
                     "--spec-ngram-mod-n-min", "48", "--spec-ngram-mod-n-max", "64")
CLASSES = {"a": "input-grounded", "b": "open-ended"}
#: The range dash of bench/RESULTS.md.
DASH = "\u2013"

# --- targets ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A server and whether it speculates."""

    name: str
    llamapy: bool
    spec: bool


TARGETS = {t.name: t for t in (Target("llamapy-off", True, False),
                               Target("llamapy-ngram", True, True),
                               Target("llama-server-off", False, False),
                               Target("llama-server-ngram", False, True))}


def llama_server_spec(n_max: int | None, override: str | None) -> list[str]:
    """llama-server's speculative flags (``ngram-mod``; with ``n_max`` its draft bounds)."""
    if override:
        return shlex.split(override)
    if n_max is None:
        return list(LLAMA_SERVER_SPEC)
    return [*LLAMA_SERVER_SPEC[:4], "--spec-ngram-mod-n-min", str(3 * n_max // 4),
            "--spec-ngram-mod-n-max", str(n_max), "--spec-draft-n-max", str(n_max)]


def target_cmd(target: Target, s: Settings, args: argparse.Namespace) -> list[str]:
    """The command line that starts ``target``."""
    if not target.llamapy:
        return llama_server_cmd(s) + (llama_server_spec(args.n_max, args.llama_server_spec)
                                      if target.spec else [])
    cmd = [*llamapy_cmd(s), "--spec-type", "ngram" if target.spec else "off"]
    if target.spec and args.n_max is not None:
        cmd += ["--spec-draft-n-max", str(args.n_max)]
    return cmd + (shlex.split(args.llamapy_spec) if target.spec and args.llamapy_spec else [])


# --- load ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """One finished chat completion."""

    key: str
    text: str
    completion_tokens: int
    timings: dict[str, Any]


@dataclass(slots=True)
class Run:
    """One target x class x stream count in one round."""

    wall_s: float = 0.0
    replies: list[Reply] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(r.completion_tokens for r in self.replies)

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def decode_tok_per_s(self) -> float | None:
        """Server-reported decode rate per stream: sum of predicted_n / predicted_ms."""
        ms = sum(float(r.timings.get("predicted_ms") or 0.0) for r in self.replies)
        n = sum(int(r.timings.get("predicted_n") or 0) for r in self.replies)
        return 1000.0 * n / ms if ms > 0 else None

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted tokens, None when the server reported no drafts."""
        drafted = sum(int(r.timings.get("draft_n") or 0) for r in self.replies)
        accepted = sum(int(r.timings.get("draft_n_accepted") or 0) for r in self.replies)
        return accepted / drafted if drafted else None

    @property
    def mean_tokens(self) -> float:
        return self.tokens / len(self.replies) if self.replies else 0.0


async def ask(client: httpx.AsyncClient, prompt: Prompt, max_tokens: int) -> Reply:
    """One non-streaming greedy chat completion."""
    body = {"messages": [{"role": "user", "content": prompt.text}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": False}
    resp = await client.post("/v1/chat/completions", json=body, timeout=900)
    resp.raise_for_status()
    data = resp.json()
    return Reply(prompt.key, data["choices"][0]["message"].get("content") or "",
                 int(data["usage"]["completion_tokens"]), dict(data.get("timings") or {}))


def waves_of(prompts: Sequence[Prompt], streams: int) -> Iterator[list[Prompt]]:
    """``prompts`` in groups of ``streams``, the last group filled from the start (so with
    fewer prompts than streams a wave repeats a prompt: in-flight prefix sharing and the n-gram
    pool then see identical requests, which is not the workload being measured)."""
    for i in range(0, len(prompts), streams):
        group = list(prompts[i:i + streams])
        yield group + [prompts[k % len(prompts)] for k in range(streams - len(group))]


async def run_class(port: int, prompts: Sequence[Prompt], streams: int, max_tokens: int) -> Run:
    """Every prompt of a class, in waves of ``streams`` concurrent requests."""
    out = Run()
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits) as client:
        await ask(client, Prompt("warm-up", "-", "Say hello."), 8)
        for group in waves_of(prompts, streams):
            t0 = time.perf_counter()
            out.replies += await asyncio.gather(*(ask(client, p, max_tokens) for p in group))
            out.wall_s += time.perf_counter() - t0
    return out


# --- rounds ----------------------------------------------------------------------------------

#: (target name, class, streams) -> one Run per round.
Results = dict[tuple[str, str, int], list[Run]]


def run_target(target: Target, s: Settings, args: argparse.Namespace,
               classes: dict[str, list[Prompt]], streams: int, results: Results) -> None:
    """Start ``target`` alone, run every class at ``streams``, stop it."""
    cwd = s.llamapy_dir if target.llamapy else None
    proc, _ = start(target_cmd(target, s, args), s.port, timeout=300, cwd=cwd)
    try:
        for cls, prompts in classes.items():
            run = asyncio.run(run_class(s.port, prompts, streams, args.max_tokens))
            results.setdefault((target.name, cls, streams), []).append(run)
            acc = "-" if run.acceptance is None else f"{100 * run.acceptance:.0f}%"
            print(f"  {target.name:18s} x{streams} ({cls}) {run.tok_per_s:7.1f} tok/s  "
                  f"decode {fmt(run.decode_tok_per_s)}  tokens/req {run.mean_tokens:5.1f}  "
                  f"accepted {acc}", flush=True)
    finally:
        stop(proc)


def run_rounds(args: argparse.Namespace, s: Settings, targets: list[Target],
               classes: dict[str, list[Prompt]]) -> Results:
    results: Results = {}
    for rnd in range(args.rounds):
        print(f"round {rnd}", flush=True)
        for target in targets if rnd % 2 == 0 else targets[::-1]:
            for streams in args.streams:
                run_target(target, s, args, classes, streams, results)
    return results


# --- report ----------------------------------------------------------------------------------


def fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def spread(xs: Sequence[float | None], digits: int = 1) -> str:
    """Median (min-max) of the values that are there."""
    vals = [x for x in xs if x is not None]
    if not vals:
        return "n/a"
    med = fmt(statistics.median(vals), digits)
    return med if len(vals) == 1 else f"{med} ({min(vals):.{digits}f}{DASH}{max(vals):.{digits}f})"


def per_round(results: Results, key: tuple[str, str, int],
              metric: Callable[[Run], float | None]) -> list[float | None]:
    return [metric(r) for r in results.get(key, [])]


def ratios(results: Results, num: str, den: str, cls: str, streams: int) -> list[float]:
    """``num`` / ``den`` tok/s, round by round."""
    pairs = zip(results.get((num, cls, streams), []), results.get((den, cls, streams), []),
                strict=False)
    return [a.tok_per_s / b.tok_per_s for a, b in pairs if b.tok_per_s]


RATIOS = (("llamapy ngram/off", "llamapy-ngram", "llamapy-off"),
          ("llama-server ngram/off", "llama-server-ngram", "llama-server-off"),
          ("llamapy-ngram / llama-server-ngram", "llamapy-ngram", "llama-server-ngram"),
          ("llamapy-off / llama-server-off", "llamapy-off", "llama-server-off"))


def print_tables(results: Results, targets: list[Target], streams: list[int]) -> None:
    print("\n| class | streams | target | tok/s | decode tok/s per stream (server) "
          "| tokens/req | draft accepted % |\n|---|---|---|---|---|---|---|")
    for cls in CLASSES:
        for c in streams:
            for t in targets:
                key = (t.name, cls, c)
                if key not in results:
                    continue
                acc = [None if r.acceptance is None else 100 * r.acceptance
                       for r in results[key]]
                print(f"| ({cls}) {CLASSES[cls]} | {c} | {t.name} "
                      f"| {spread(per_round(results, key, lambda r: r.tok_per_s))} "
                      f"| {spread(per_round(results, key, lambda r: r.decode_tok_per_s))} "
                      f"| {spread(per_round(results, key, lambda r: r.mean_tokens))} "
                      f"| {spread(acc, 0)} |")
    print("\n| class | streams | " + " | ".join(r[0] for r in RATIOS) + " |")
    print("|---|---|" + "---|" * len(RATIOS))
    for cls in CLASSES:
        for c in streams:
            cells = [spread(list(ratios(results, num, den, cls, c)), 2) for _, num, den in RATIOS]
            if any(cell != "n/a" for cell in cells):
                print(f"| ({cls}) | {c} | " + " | ".join(cells) + " |")


def median_ratio(results: Results, num: str, den: str, cls: str, c: int) -> float | None:
    xs = ratios(results, num, den, cls, c)
    return statistics.median(xs) if xs else None


def print_goals(results: Results, streams: list[int]) -> None:
    goals = [("(a) 1 stream: llamapy ngram/off >= 1.8", "llamapy-ngram", "llamapy-off", "a",
              1, 1.8)]
    for c in streams:
        at = f"{c} stream{'s' if c > 1 else ''}"
        goals += [(f"({cls}) {at}: llamapy-ngram / llama-server-ngram >= 1.0",
                   "llamapy-ngram", "llama-server-ngram", cls, c, 1.0) for cls in CLASSES]
        goals.append((f"(b) {at}: llamapy ngram/off >= 0.95", "llamapy-ngram",
                      "llamapy-off", "b", c, 0.95))
    print("\nGoals (medians of the per-round ratios):")
    for label, num, den, cls, c, bar in goals:
        x = median_ratio(results, num, den, cls, c)
        verdict = "not measured" if x is None else ("met" if x >= bar else "NOT met")
        print(f"- {label}: {fmt(x, 2)} -> {verdict}")


def print_mismatches(results: Results) -> None:
    """Greedy 1-stream texts of off vs ngram, per server, prompt and round."""
    for server in ("llamapy", "llama-server"):
        off = results_texts(results, f"{server}-off")
        on = results_texts(results, f"{server}-ngram")
        if not off or not on:
            continue
        keys = sorted(set(off) & set(on))
        bad = [k for k in keys if off[k] != on[k]]
        print(f"\n{server} off vs ngram, 1 stream, greedy: {len(bad)}/{len(keys)} outputs differ"
              + "".join(f"\n  round {r} {p}: first difference at character "
                        f"{first_difference(off[(r, p)], on[(r, p)])}" for r, p in bad))


def results_texts(results: Results, target: str) -> dict[tuple[int, str], str]:
    out = {}
    for cls in CLASSES:
        for rnd, run in enumerate(results.get((target, cls, 1), [])):
            out.update({(rnd, r.key): r.text for r in run.replies})
    return out


def first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--streams", default="1,4", help="comma-separated concurrency levels")
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset")
    p.add_argument("--prompts", default="", help="comma-separated prompt keys (default: all)")
    p.add_argument("--n-max", type=int, help="--spec-draft-n-max for both servers (and "
                   "llama-server's --spec-ngram-mod-n-max)")
    p.add_argument("--llama-server-spec", help="llama-server's speculative flags, replacing "
                   f"{' '.join(LLAMA_SERVER_SPEC)!r} (pass as --llama-server-spec='...')")
    p.add_argument("--llamapy-spec", help="extra flags for llamapy-ngram, e.g. "
                   "--llamapy-spec='--no-spec-adaptive --spec-ngram-size 3'")
    p.add_argument("--llamapy-dir", default=str(Path(__file__).resolve().parents[1]),
                   help="run llamapy.serve from this checkout (default: this script's)")
    args = p.parse_args(argv)
    args.streams = [int(x) for x in args.streams.split(",")]
    unknown = set(args.targets.split(",")) - set(TARGETS)
    if unknown:
        p.error(f"unknown targets {sorted(unknown)}; valid: {', '.join(TARGETS)}")
    args.targets = [TARGETS[n] for n in TARGETS if n in args.targets.split(",")]
    return args


def select_prompts(keys: str) -> dict[str, list[Prompt]]:
    wanted = set(filter(None, keys.split(",")))
    unknown = wanted - {p.key for p in PROMPTS}
    if unknown:
        raise SystemExit(f"unknown prompts {sorted(unknown)}")
    chosen = [p for p in PROMPTS if not wanted or p.key in wanted]
    return {cls: [p for p in chosen if p.cls == cls] for cls in CLASSES
            if any(p.cls == cls for p in chosen)}


def main() -> None:
    args = parse_args()
    # as many slots as the most concurrent streams (at least 4), 2048 cells each: a wave
    # never queues and never runs out of KV
    n_parallel = max(4, *args.streams)
    s = Settings(n_ctx=max(8192, 2048 * n_parallel), n_parallel=n_parallel,
                 llamapy_dir=args.llamapy_dir)
    classes = select_prompts(args.prompts)
    print(f"n_ctx {s.n_ctx}, n_parallel {s.n_parallel}, n_batch {s.n_batch}, threads "
          f"{s.threads}, max_tokens {args.max_tokens}, rounds {args.rounds}, streams "
          f"{args.streams}, llamapy from {args.llamapy_dir}\nllama-server-ngram: "
          f"{' '.join(llama_server_spec(args.n_max, args.llama_server_spec))}", flush=True)
    results = run_rounds(args, s, args.targets, classes)
    print_tables(results, args.targets, args.streams)
    print_goals(results, args.streams)
    print_mismatches(results)


if __name__ == "__main__":
    main()
