#!/usr/bin/env python3
"""Python time per engine tick as a share of tick time, on the real model in-process.

Runs waves of concurrent streaming requests (~100-token prompts, 64 tokens out) through the
``Server`` and splits tick time into native work (``llama_decode``, native sampling) and the
Python around it (engine phases, batch filling, event delivery).
Usage: ``python bench/bench_tick.py [--concurrency 8] [--waves 3]``
"""

from __future__ import annotations

import argparse
import random

from bench_server import TickTimer, llamapy_runner, run_wave, text_of

from llamapy._system import physical_cores
from llamapy.models import default_model_path
from llamapy.server import Server


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--waves", type=int, default=3)
    args = p.parse_args()
    with Server(default_model_path(), n_ctx=8192, n_parallel=8,
                n_threads=physical_cores()) as server:
        server.wait_ready(120)
        runner = llamapy_runner(server)
        runner("warm up", 4)
        timer = TickTimer(server)
        timer.on = True
        rng = random.Random(1)
        for _ in range(args.waves):
            prompts = [f"{rng.random():.6f}: " + text_of(rng, 70) for _ in range(args.concurrency)]
            run_wave(runner, prompts, 64)
        timer.on = False
    per_tick_us = 1e6 * (timer.tick_s - timer.native_s) / max(1, timer.ticks)
    print(f"{timer.ticks} ticks, mean tick {1e3 * timer.tick_s / max(1, timer.ticks):.2f} ms, "
          f"Python {per_tick_us:.0f} us/tick = {100 * timer.python_share:.2f}% of tick time")


if __name__ == "__main__":
    main()
