"""``/rerank`` against llama-server's, same build, same model: pairs scored per second.

Both servers run the tiny reranker of ``llamapy.testing.tiny_reranker_path`` (arbitrary
weights: a model this small measures the serving path, HTTP, tokenizing and batching, more
than the model) with ``--reranking``, one at a time, alternated round by round. Each round
sends ``--requests`` requests, each a query and ``--docs`` documents of 20-60 words, from
``--clients`` clients at once (each sends its share one after another) to servers with
``--parallel`` slots, and takes the pairs scored per second over the round.

    python bench/bench_rerank.py --rounds 4 --requests 20 --docs 32
    python bench/bench_rerank.py --rounds 4 --requests 20 --docs 32 --parallel 4 --clients 4

``--checkout DIR`` adds a third target: ``python -m llamapy.serve`` run from another checkout
(with its binding built), e.g. the commit before a change.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from http_load import WORDS, start, stop

from llamapy._paths import current_build
from llamapy.testing import tiny_reranker_path

PORT = 18197


def commands(threads: int, parallel: int) -> dict[str, list[str]]:
    """Each target's command line (the same model, context and threads)."""
    build = current_build()
    assert build, "run python build_lib.py --with-server"
    model = str(tiny_reranker_path())
    common = ["--port", str(PORT), "--host", "127.0.0.1", "-t", str(threads), "-c", "2048",
              "--reranking"]
    return {"llama-server": [str(Path(build["lib_dir"]) / "llama-server"), "-m", model,
                             "-np", str(parallel), *common],
            "llamapy.serve": [sys.executable, "-m", "llamapy.serve", "--model", model,
                              "--n-parallel", str(parallel), "--log-level", "warning",
                              *common]}


def bodies(n: int, docs: int, seed: int) -> list[dict[str, object]]:
    """``n`` rerank bodies of ``docs`` documents each (the same for every target)."""
    rng = random.Random(seed)

    def text(low: int, high: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))

    return [{"query": text(4, 10), "documents": [text(20, 60) for _ in range(docs)]}
            for _ in range(n)]


def send(requests: list[dict[str, object]]) -> int:
    """Send ``requests`` one after another; the pairs scored."""
    pairs = 0
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=120) as client:
        for body in requests:
            answer = client.post("/rerank", json=body)
            answer.raise_for_status()
            pairs += len(answer.json()["results"])
    return pairs


def one_round(cmd: list[str], requests: list[dict[str, object]], clients: int,
              cwd: str | None = None) -> float:
    """Pairs per second over ``requests``, shared by ``clients`` sending at once (the
    server started in ``cwd``)."""
    proc, _ = start(cmd, PORT, cwd=cwd)
    try:
        send(requests[:1])  # warm-up
        shares = [requests[i::clients] for i in range(clients)]
        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            pairs = sum(pool.map(send, shares))
        return pairs / (time.perf_counter() - started)
    finally:
        stop(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=1, help="slots of both servers")
    ap.add_argument("--clients", type=int, default=1, help="clients sending at once")
    ap.add_argument("--checkout", help="another llamapy checkout to run as a third target")
    args = ap.parse_args()
    targets = commands(args.threads, args.parallel)
    if args.checkout:
        targets["checkout"] = targets["llamapy.serve"]
    requests = bodies(args.requests, args.docs, seed=7)
    rates: dict[str, list[float]] = {name: [] for name in targets}
    for r in range(args.rounds):
        order = list(targets) if r % 2 == 0 else list(targets)[::-1]
        for name in order:
            cwd = args.checkout if name == "checkout" else None
            rates[name].append(one_round(targets[name], requests, args.clients, cwd))
            print(f"round {r} {name:14} {rates[name][-1]:8.1f} pairs/s", flush=True)
    print("\n| target | pairs/s (rounds) | median |\n|---|---|---|")
    for name, xs in rates.items():
        print(f"| {name} | {' / '.join(f'{x:.0f}' for x in xs)} | {statistics.median(xs):.0f} |")
    for name in [n for n in rates if n != "llama-server"]:
        ratios = [a / b for a, b in zip(rates[name], rates["llama-server"], strict=True)]
        print(f"\n{name} / llama-server: median of rounds {statistics.median(ratios):.2f} "
              f"(rounds {', '.join(f'{x:.2f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
