#!/usr/bin/env python3
"""Fair share between tenants: tenant B's time to first token while tenant A floods.

One ``python -m llamapy.serve`` (SmolLM2, ``--n-parallel 4``) with an API-key file of two
tenants (``ka alpha``, ``kb beta``), ``--tenant-max-slots 3`` (one tenant's runs hold at most 3
of the 4 slots) and ``--tenant-max-requests`` (A's queued + running bound, under
``--max-queue``). Each round runs three phases, in an order that rotates from round to round:

- ``solo``: B alone: ``--probes`` streamed ``/v1/completions`` one after another (a fresh
  ~100-token prompt each, 8 tokens out); their TTFT is B's solo value.
- ``fair``: the same probes with B's key while A keeps ``--flood`` streams of 64 tokens in
  flight (each finished stream replaced at once).
- ``shared``: the same flood and ``--shared-probes`` probes (each waits for a long queue),
  but B sends A's key: one tenant, so B waits behind A's queue, as every client did before
  tenants.

With ``--llama-server`` (``python build_lib.py --with-server``), llama-server from the same
build runs the same ``solo`` and ``flood`` phases as the peer (``--api-key ka,kb``, the same
``-np``, ``-c``, ``-b`` and threads; it has no tenants, so its ``flood`` is ``shared``), the
targets alternating round by round.

It prints B's TTFT p50 / p99 per phase and the ratios to ``solo``; the issue's target is
``fair`` p99 within 2x of ``solo`` p99. Run nothing else on the machine meanwhile. Usage:

    python bench/bench_tenants.py --rounds 3 --flood 32 --probes 20 --llama-server
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx
from http_load import (
    Settings,
    byte_compile,
    llama_server_cmd,
    llamapy_cmd,
    prompts_for,
    start,
    stop,
    token_times,
)

KEYS = "ka alpha\nkb beta\n"
PHASES = ("solo", "fair", "shared")
PEER_PHASES = ("solo", "flood")


def server_cmd(s: Settings, keys: Path, args: argparse.Namespace) -> list[str]:
    """The llamapy server with two tenants."""
    return [*llamapy_cmd(s), "--api-key-file", str(keys), "--max-queue", str(args.max_queue),
            "--tenant-max-slots", str(s.n_parallel - 1),
            "--tenant-max-requests", str(args.max_queue - 8)]


async def ttft(client: httpx.AsyncClient, prompt: str) -> float:
    """One streamed completion of 8 tokens: seconds to its first token."""
    times = await token_times(client, "/v1/completions", prompt, 8)
    return times[1] - times[0]


async def flood(client: httpx.AsyncClient, streams: int, stop_at: asyncio.Event,
                seed: int) -> int:
    """Keep ``streams`` 64-token streams in flight until ``stop_at``; returns streams done."""
    done = 0

    async def worker(i: int) -> None:
        nonlocal done
        n = 0
        while not stop_at.is_set():
            prompt = prompts_for(1, seed * 100_000 + i * 1000 + n, f"flood{i}")[0]
            n += 1
            try:
                await token_times(client, "/v1/completions", prompt, 64)
                done += 1
            except httpx.HTTPError:
                await asyncio.sleep(0.05)  # a 429 over A's bound: try again shortly

    await asyncio.gather(*(worker(i) for i in range(streams)))
    return done


async def phase(port: int, name: str, args: argparse.Namespace, seed: int) -> list[float]:
    """B's probe TTFTs in one phase."""
    base = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=args.flood + 8)
    probe_key = "ka" if name == "shared" else "kb"  # llama-server's "flood": B's own key
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=600,
                                 headers={"Authorization": "Bearer ka"}) as a_client, \
            httpx.AsyncClient(base_url=base, timeout=600,
                              headers={"Authorization": f"Bearer {probe_key}"}) as b_client:
        stop_at = asyncio.Event()
        flooding = (asyncio.ensure_future(flood(a_client, args.flood, stop_at, seed))
                    if name != "solo" else None)
        if flooding is not None:
            await asyncio.sleep(args.warmup)  # A's queue fills first
        out = []
        probes = args.shared_probes if name in ("shared", "flood") else args.probes
        for prompt in prompts_for(probes, seed, f"probe-{name}"):
            out.append(await ttft(b_client, prompt))
            await asyncio.sleep(args.gap)
        stop_at.set()
        if flooding is not None:
            await flooding
    return out


def quantile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(target: str, ttfts: dict[str, list[float]]) -> None:
    solo_p50, solo_p99 = quantile(ttfts["solo"], 0.5), quantile(ttfts["solo"], 0.99)
    print(f"{'target':12s} {'phase':8s} {'n':>4s} {'p50 ms':>8s} {'p99 ms':>8s} "
          f"{'p50/solo':>9s} {'p99/solo':>9s}")
    for name, xs in ttfts.items():
        p50, p99 = quantile(xs, 0.5), quantile(xs, 0.99)
        print(f"{target:12s} {name:8s} {len(xs):4d} {p50 * 1e3:8.1f} {p99 * 1e3:8.1f} "
              f"{p50 / solo_p50:9.2f} {p99 / solo_p99:9.2f}")


def per_round(target: str, ttfts: dict[str, list[list[float]]]) -> None:
    for i, _ in enumerate(ttfts["solo"]):
        solo = quantile(ttfts["solo"][i], 0.99)
        ratios = "  ".join(f"{name} p99/solo {quantile(ttfts[name][i], 0.99) / solo:5.2f}"
                           for name in ttfts if name != "solo" and ttfts[name])
        print(f"{target:12s} round {i + 1}: solo p99 {solo * 1e3:6.1f} ms  {ratios}")


def run_round(target: str, port: int, phases: tuple[str, ...], rnd: int,
              args: argparse.Namespace, out: dict[str, list[list[float]]]) -> None:
    """One round of ``phases`` on one target, in an order that rotates by round."""
    k = rnd % len(phases)
    for name in phases[k:] + phases[:k]:
        t0 = time.perf_counter()
        xs = asyncio.run(phase(port, name, args, seed=rnd * 10 + 1))
        out[name].append(xs)
        if args.verbose:
            print("  " + " ".join(f"{x * 1e3:.0f}" for x in xs))
        print(f"{target:12s} round {rnd + 1} {name:6s}: p50 {statistics.median(xs) * 1e3:7.1f} "
              f"ms  p99 {quantile(xs, 0.99) * 1e3:7.1f} ms  ({time.perf_counter() - t0:.0f} s)",
              flush=True)


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flood", type=int, default=32, help="A's streams in flight")
    parser.add_argument("--probes", type=int, default=20, help="B's requests per phase")
    parser.add_argument("--shared-probes", type=int, default=5,
                        help="B's requests in the phases where it waits behind A's queue")
    parser.add_argument("--phases", default=",".join(PHASES), help="llamapy's phases")
    parser.add_argument("--verbose", action="store_true", help="print every TTFT")
    parser.add_argument("--gap", type=float, default=0.2, help="seconds between B's probes")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds A floods first")
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-batch", type=int, default=512, help="both servers' -b")
    parser.add_argument("--llama-server", action="store_true", help="llama-server as the peer")
    return parser.parse_args()


def main() -> None:
    """Alternate rounds of every phase on llamapy (and llama-server), then report them."""
    args = parse_args()
    ours = Settings(n_ctx=8192, n_parallel=4, n_batch=args.n_batch, threads=args.threads)
    peer = replace(ours, port=ours.port + 1)
    byte_compile()
    results: dict[str, dict[str, list[list[float]]]] = {
        "llamapy": {name: [] for name in PHASES}, "llama-server": {n: [] for n in PEER_PHASES}}
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys"
        keys.write_text(KEYS)
        procs = [start(server_cmd(ours, keys, args), ours.port)[0]]
        if args.llama_server:
            procs.append(start([*llama_server_cmd(peer), "--api-key", "ka,kb"], peer.port)[0])
        try:
            for rnd in range(args.rounds):
                targets = [("llamapy", ours.port, tuple(args.phases.split(",")))]
                if args.llama_server:
                    targets.append(("llama-server", peer.port, PEER_PHASES))
                for target, port, phases in (targets if rnd % 2 == 0 else targets[::-1]):
                    run_round(target, port, phases, rnd, args, results[target])
        finally:
            for proc in procs:
                stop(proc)
    for target, rounds in results.items():
        if rounds["solo"]:
            per_round(target, rounds)
    for target, rounds in results.items():
        if rounds["solo"]:
            report(target, {name: [x for xs in r for x in xs] for name, r in rounds.items()
                            if r})


if __name__ == "__main__":
    sys.exit(main())
