#!/usr/bin/env python3
"""A 30-turn tool-using conversation over ``/v1/responses``, continued by
``previous_response_id`` (each turn sends its new items only) over HTTP and over the Responses
WebSocket (one socket for the whole conversation), against the same conversation sent whole
every turn (``store: false``), on ``python -m llamapy.serve`` with the default model.

Each turn: the assistant's previous answer is followed by a ``function_call``/
``function_call_output`` pair (a ~60-token tool result) and a short user message; greedy,
24 output tokens. The three conversations run side by side on their own slots, turn k of each
right after turn k of the others (their order rotating), so all see the same machine.
Reported for turns >= 2: the share of prompt tokens served from cache
(``input_tokens_details.cached_tokens`` / ``input_tokens``), the bytes each client sent, and
TTFT p50/p90 (streamed; time to the first ``response.output_text.delta``).

``--model`` serves another GGUF: on a model whose turns compute for a few ms (the tiny
generated hybrid, ``llamapy.testing.tiny_hybrid_path()``) TTFT shows what each protocol costs
around the computation.

``--codex`` gives every turn Codex's prefix: the 9 tools Codex 0.171 sent (functions, a
namespace, a hosted ``web_search``; from the recorded session in ``tests/fixtures/codex``) and
instructions as long as Codex's base instructions (16,979 characters of generated words; their
text is elided from the recording). Without it the prefix is one short sentence and no tools.

Usage: ``PYTHONPATH=.:bench python bench/bench_responses_store.py [--turns 30] [--model GGUF]
[--codex] [--n-ctx N]`` (nothing else running).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from http_load import start, stop, text_of
from websockets.sync.client import ClientConnection, connect

PORT = 18197
SYSTEM = "You are a coding agent. Use the tools, then answer in one short sentence."
FIXTURE = Path(__file__).parent.parent / "tests" / "fixtures" / "codex" / "codex_0_171.json"
#: The length of Codex 0.171's base instructions (characters).
CODEX_INSTRUCTIONS = 16_979
#: What every request carries besides its input (``--codex`` sets Codex's).
PREFIX: dict[str, Any] = {"instructions": SYSTEM}


def codex_prefix() -> dict[str, Any]:
    """Codex's tools as recorded, and instructions of its base instructions' length."""
    recorded = json.loads(FIXTURE.read_text())["sockets"][0]["exchanges"][0]["request"]
    text = text_of(random.Random(7), CODEX_INSTRUCTIONS // 5)[:CODEX_INSTRUCTIONS]
    return {"instructions": text, "tools": recorded["tools"]}


def tool_turn(rng: random.Random, k: int) -> list[dict[str, Any]]:
    call = f"call_{k}"
    return [{"type": "function_call", "call_id": call, "name": "run",
             "arguments": json.dumps({"cmd": f"pytest -k case{k}"})},
            {"type": "function_call_output", "call_id": call, "output": text_of(rng, 45)},
            {"role": "user", "content": f"Step {k}: what next?"}]


def turn(client: httpx.Client, body: dict[str, Any]) -> tuple[dict[str, Any], float, int]:
    """One streamed response: the final response, TTFT, bytes sent."""
    payload = json.dumps({**body, "stream": True, "temperature": 0, "max_output_tokens": 24,
                          **PREFIX}).encode()
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


def ws_turn(socket: ClientConnection, body: dict[str, Any]) -> tuple[dict[str, Any], float, int]:
    """One response over the WebSocket: the final response, TTFT, bytes sent."""
    frame = json.dumps({"type": "response.create", **body, "temperature": 0,
                        "max_output_tokens": 24, **PREFIX})
    started, first = time.perf_counter(), None
    socket.send(frame)
    while True:
        event = json.loads(socket.recv())
        if first is None and event["type"] == "response.output_text.delta":
            first = time.perf_counter() - started
        if event["type"] in ("response.completed", "response.incomplete"):
            return event["response"], first or time.perf_counter() - started, len(frame)
        if event["type"] == "error":
            raise RuntimeError(event)


MODES = ("whole", "chain", "socket")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--model", default=None, help="a GGUF (default: the server's default)")
    p.add_argument("--n-ctx", type=int, default=16384)
    p.add_argument("--codex", action="store_true", help="Codex's tools and instructions' length")
    args = p.parse_args()
    if args.codex:
        PREFIX.update(codex_prefix())
    store = tempfile.mkdtemp() + "/responses.sqlite3"
    proc, _ = start([sys.executable, "-m", "llamapy.serve", "--port", str(PORT), "--n-parallel",
                     "3", "--n-ctx", str(args.n_ctx), "--responses-store", store, "--log-level",
                     "warning", *(["--model", args.model] if args.model else [])], PORT)
    stats: dict[str, dict[str, list[float]]] = {m: {"cached": [], "input": [], "ttft": [],
                                                     "bytes": []} for m in MODES}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=300) as client, \
                connect(f"ws://127.0.0.1:{PORT}/v1/responses", max_size=None) as socket:
            run(client, socket, args.turns, stats)
    finally:
        stop(proc)
    report(stats)


def run(client: httpx.Client, socket: ClientConnection, turns: int,
        stats: dict[str, dict[str, list[float]]]) -> None:
    rng = {mode: random.Random(1) for mode in MODES}
    previous: dict[str, str] = {}
    history: list[dict[str, Any]] = []
    for k in range(turns):
        for mode in MODES[k % 3:] + MODES[:k % 3]:
            new = tool_turn(rng[mode], k) + [{"role": "user", "content": f"[{mode}]"}] * (k == 0)
            if mode == "whole":
                history += new
                body: dict[str, Any] = {"input": history, "store": False}
            else:
                body = {"input": new, **({"previous_response_id": previous[mode]}
                                         if mode in previous else {})}
            response, ttft, sent = (ws_turn(socket, body) if mode == "socket"
                                    else turn(client, body))
            if mode == "whole":
                history += response["output"]
            else:
                previous[mode] = response["id"]
            if k:
                usage = response["usage"]
                for name, value in (("cached", usage["input_tokens_details"]["cached_tokens"]),
                                    ("input", usage["input_tokens"]), ("ttft", ttft),
                                    ("bytes", sent)):
                    stats[mode][name].append(value)


def report(stats: dict[str, dict[str, list[float]]]) -> None:
    print("| turns >= 2 | sent whole (HTTP) | previous_response_id (HTTP) | ratio "
          "| previous_response_id (WebSocket) | ratio |")
    print("|---|---|---|---|---|---|")
    rows = {m: {"cached share %": 100 * sum(s["cached"]) / sum(s["input"]),
                "prompt tokens / turn": statistics.mean(s["input"]),
                "bytes sent / turn": statistics.mean(s["bytes"]),
                "TTFT p50 ms": 1000 * statistics.median(s["ttft"]),
                "TTFT p90 ms": 1000 * statistics.quantiles(s["ttft"], n=10)[-1]}
            for m, s in stats.items()}
    for label in rows["whole"]:
        a, b, c = (rows[m][label] for m in MODES)
        print(f"| {label} | {a:.1f} | {b:.1f} | {b / a:.2f} | {c:.1f} | {c / a:.2f} |")


if __name__ == "__main__":
    main()
