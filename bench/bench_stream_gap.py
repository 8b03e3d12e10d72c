#!/usr/bin/env python3
"""One stream at a time: the token gap a client sees, request after request.

Starts one server (llama-server or ``python -m llamapy.serve``, the settings of
``http_load.Settings``), sends ``--requests`` streamed ``/v1/completions`` one after the other
(distinct ~100-token prompts, 64 tokens, greedy, ``ignore_eos``) and prints, for each, the time
to the first token and the mean gap between tokens. A gap that grows from request to request
means the earlier requests' resident KV slows later decodes (see ``bench/RESULTS.md``, "Idle
slots parked in RAM"). Extra ``llamapy.serve`` flags after ``--``.

Usage: ``python bench/bench_stream_gap.py [--target llamapy|llama-server] [--requests 6]
[-- --no-kv-unified]`` (nothing else on the machine).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import httpx
from http_load import Settings, llama_server_cmd, llamapy_cmd, prompts_for, start, stop


def one_stream(port: int, prompt: str) -> tuple[float, float]:
    """(time to first token, mean gap between tokens in ms) of one streamed completion."""
    body = {"prompt": prompt, "max_tokens": 64, "temperature": 0.0, "stream": True,
            "ignore_eos": True}
    arrivals: list[float] = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        t0 = time.perf_counter()
        with client.stream("POST", "/v1/completions", json=body) as resp:
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if choices and choices[0].get("text") is not None:
                    arrivals.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return arrivals[0] - t0, 1000 * statistics.mean(gaps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", choices=("llamapy", "llama-server"), default="llamapy")
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("extra", nargs="*", help="more llamapy.serve flags (after --)")
    args = p.parse_args()
    s = Settings(n_parallel=4)
    cmd = llamapy_cmd(s) + args.extra if args.target == "llamapy" else llama_server_cmd(s)
    proc, _ = start(cmd, s.port)
    time.sleep(1.0)  # llama-server can drop the very first connection after /health says ok
    try:
        for i in range(args.requests):
            ttft, gap = one_stream(s.port, prompts_for(1, 100 + i, "gap")[0])
            print(f"{args.target} request {i}: TTFT {ttft:.3f} s, token gap {gap:.2f} ms",
                  flush=True)
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
