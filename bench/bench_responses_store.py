#!/usr/bin/env python3
"""A 30-turn tool-using conversation over ``/v1/responses``, continued by
``previous_response_id`` (each turn sends its new items only) against the same conversation
sent whole every turn (``store: false``), on ``python -m llamapy.serve`` with the default
model.

Each turn: the assistant's previous answer is followed by a ``function_call``/
``function_call_output`` pair (a ~60-token tool result) and a short user message; greedy,
24 output tokens. The two conversations run side by side on their own slots, turn k of one
right after turn k of the other (and their order alternating), so both see the same machine.
Reported for turns >= 2: the share of prompt tokens served from cache
(``input_tokens_details.cached_tokens`` / ``input_tokens``), the bytes each client sent, and
TTFT p50/p90 (streamed; time to the first ``response.output_text.delta``).

Usage: ``PYTHONPATH=. python bench/bench_responses_store.py [--turns 30]`` (nothing else
running).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx
from http_load import start, stop, text_of

PORT = 18197
SYSTEM = "You are a coding agent. Use the tools, then answer in one short sentence."


def tool_turn(rng: random.Random, k: int) -> list[dict[str, Any]]:
    call = f"call_{k}"
    return [{"type": "function_call", "call_id": call, "name": "run",
             "arguments": json.dumps({"cmd": f"pytest -k case{k}"})},
            {"type": "function_call_output", "call_id": call, "output": text_of(rng, 45)},
            {"role": "user", "content": f"Step {k}: what next?"}]


def turn(client: httpx.Client, body: dict[str, Any]) -> tuple[dict[str, Any], float, int]:
    """One streamed response: the final response, TTFT, bytes sent."""
    payload = json.dumps({**body, "stream": True, "temperature": 0, "max_output_tokens": 24,
                          "instructions": SYSTEM}).encode()
    started, first = time.perf_counter(), None
    with client.stream("POST", "/v1/responses", content=payload,
                       headers={"content-type": "application/json"}) as r:
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if first is None and event["type"] == "response.output_text.delta":
                first = time.perf_counter() - started
            if event["type"] in ("response.completed", "response.incomplete"):
                return event["response"], first or time.perf_counter() - started, len(payload)
    raise RuntimeError(f"no final event: {r.status_code}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--turns", type=int, default=30)
    args = p.parse_args()
    store = tempfile.mkdtemp() + "/responses.sqlite3"
    proc, _ = start([sys.executable, "-m", "llamapy.serve", "--port", str(PORT), "--n-parallel",
                     "2", "--n-ctx", "16384", "--responses-store", store, "--log-level",
                     "warning"], PORT)
    stats: dict[str, dict[str, list[float]]] = {m: {"cached": [], "input": [], "ttft": [],
                                                     "bytes": []} for m in ("chain", "whole")}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=300) as client:
            run(client, args.turns, stats)
    finally:
        stop(proc)
    report(stats)


def run(client: httpx.Client, turns: int, stats: dict[str, dict[str, list[float]]]) -> None:
    rng = {"chain": random.Random(1), "whole": random.Random(1)}
    previous: str | None = None
    history: list[dict[str, Any]] = []
    for k in range(turns):
        for mode in (("chain", "whole") if k % 2 == 0 else ("whole", "chain")):
            new = tool_turn(rng[mode], k) + [{"role": "user", "content": f"[{mode}]"}] * (k == 0)
            if mode == "chain":
                body = {"input": new, **({"previous_response_id": previous} if previous else {})}
            else:
                history += new
                body = {"input": history, "store": False}
            response, ttft, sent = turn(client, body)
            if mode == "chain":
                previous = response["id"]
            else:
                history += response["output"]
            if k:
                usage = response["usage"]
                for name, value in (("cached", usage["input_tokens_details"]["cached_tokens"]),
                                    ("input", usage["input_tokens"]), ("ttft", ttft),
                                    ("bytes", sent)):
                    stats[mode][name].append(value)


def report(stats: dict[str, dict[str, list[float]]]) -> None:
    print("| turns >= 2 | sent whole | previous_response_id | ratio |")
    print("|---|---|---|---|")
    rows = {m: {"cached share %": 100 * sum(s["cached"]) / sum(s["input"]),
                "prompt tokens / turn": statistics.mean(s["input"]),
                "bytes sent / turn": statistics.mean(s["bytes"]),
                "TTFT p50 ms": 1000 * statistics.median(s["ttft"]),
                "TTFT p90 ms": 1000 * statistics.quantiles(s["ttft"], n=10)[-1]}
            for m, s in stats.items()}
    for label in rows["whole"]:
        a, b = rows["whole"][label], rows["chain"][label]
        print(f"| {label} | {a:.1f} | {b:.1f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
