#!/usr/bin/env python3
"""Ray Serve affinity: llamapy's affinity router against Ray's default router.

A functional measurement, not a speed benchmark: a local 2-CPU Ray cluster on loopback, two
applications of 2 replicas each (SmolLM2-135M, 1 llama.cpp thread, 4 slots, 2048 cells, a
64 MB RAM prompt cache), one routed by :class:`llamapy.ray.AffinityRouter`, one by Ray's
default (power of two choices). The workload is the tests' (``tests/ray/ray_workload.py``):
conversations sharing a system prompt, asked in rounds (turn 1 of each, then turn 2, ...),
``--concurrency`` requests at a time, each turn streamed with its whole history. Reported over
the turns after each conversation's first: the share served by the replica that served its
previous turn, the share of prompt tokens read from the KV cache (``timings.cache_n``) and the
TTFT median, measured by the client (through Ray's proxy, the ingress and the router) and by
the replica's engine (``timings.ttft_ms``: queue and prefill). Rounds alternate the routers;
each run asks new conversations; the medians over the rounds are printed as a table.

Usage: ``python bench/bench_ray_affinity.py [--rounds 2] [--conversations 8] [--turns 4]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "ray")]  # this checkout, the workload

import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray_workload import run_workload, summary  # noqa: E402

from llamapy.models import default_model_path  # noqa: E402
from llamapy.options import DeploymentOptions  # noqa: E402
from llamapy.ray import build_app  # noqa: E402

START = {"n_ctx": 2048, "n_parallel": 4, "n_batch": 256, "chunk_size": 256, "n_threads": 1,
         "max_queue": 32, "prompt_cache_ram_mb": 64}
ROUTERS = ("affinity", "default")
COLUMNS = ("same_replica_share", "cached_token_share", "ttft_p50_ms", "server_ttft_p50_ms")


def deploy(port: int) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20,
             runtime_env={"env_vars": {"PYTHONPATH": path}}, logging_level="ERROR",
             log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    for router in ROUTERS:
        options = DeploymentOptions(router=router, replica_cpus=0)
        serve.run(build_app(default_model_path(), deployment=options, **START),
                  name=router, route_prefix=f"/{router}")
    return {router: f"http://127.0.0.1:{port}/{router}" for router in ROUTERS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    urls = deploy(port)
    results: dict[str, list[dict[str, float]]] = {router: [] for router in ROUTERS}
    try:
        for r in range(args.rounds):
            for router in ROUTERS if r % 2 == 0 else ROUTERS[::-1]:
                figures = summary(run_workload(
                    urls[router], conversations=args.conversations, turns=args.turns,
                    concurrency=args.concurrency, first=1000 * (r + 1)))
                results[router].append(figures)
                print(router, figures, flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    print("\n| router | same replica (turns >= 2) | cached-token share | TTFT p50 client |"
          " TTFT p50 server |")
    print("|---|---|---|---|---|")
    for router in ROUTERS:
        cells = [statistics.median(f[c] for f in results[router]) for c in COLUMNS]
        print(f"| {router} | {cells[0]:.0%} | {cells[1]:.0%} | {cells[2]:.0f} ms "
              f"| {cells[3]:.0f} ms |")


if __name__ == "__main__":
    main()
