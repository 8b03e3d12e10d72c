#!/usr/bin/env python3
"""Single-stream greedy decode: the cffi binding against ``llama-bench`` tg128, same build.

Both run the default model with the same thread count. ``llama-bench`` decodes 128 tokens one
at a time into an empty context (``-p 0 -n 128``); the binding does the same through
``Context.decode`` (a) without sampling, like llama-bench, and (b) with a greedy native
sampler chain, as a user would. Reports tok/s and the ratio to llama-bench.

Needs ``python build_lib.py --with-server`` (it builds llama-bench from the same source).
Usage: ``python bench/bench_decode.py [--threads N] [--reps 5]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from llamapy._native import Batch, Context, Model, SamplerChain
from llamapy._paths import current_build
from llamapy._system import physical_cores
from llamapy.models import default_model_path


def llama_bench(model: Path, threads: int, reps: int) -> list[float]:
    build = current_build()
    assert build, "run python build_lib.py --with-server first"
    exe = Path(build["lib_dir"]) / "llama-bench"
    out = subprocess.run([str(exe), "-m", str(model), "-p", "0", "-n", "128", "-t", str(threads),
                          "-r", str(reps), "-o", "json"], capture_output=True, text=True,
                         check=True)
    return [float(x) for x in json.loads(out.stdout)[0]["samples_ts"]]


def binding(model: Model, threads: int, reps: int, sample: bool) -> list[float]:
    rates = []
    with Context(model, n_ctx=512, n_batch=512, n_threads=threads) as ctx:
        batch = Batch(8)
        chain = SamplerChain(model).add_greedy()
        for _ in range(reps + 1):  # first run warms up
            ctx.clear()
            token, start = model.bos, time.perf_counter()
            for pos in range(128):
                batch.clear()
                row = batch.add(0, pos, [token])
                ctx.decode(batch)
                token = chain.sample(ctx, row) if sample else token
            rates.append(128 / (time.perf_counter() - start))
        chain.close()
    return rates[1:]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=physical_cores())
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    path = default_model_path()
    ref = llama_bench(path, args.threads, args.reps)
    with Model(path) as model:
        raw = binding(model, args.threads, args.reps, sample=False)
        greedy = binding(model, args.threads, args.reps, sample=True)
    base = statistics.median(ref)
    print(f"threads={args.threads} reps={args.reps} (median tok/s, min-max)")
    for name, rates in (("llama-bench tg128", ref), ("binding decode", raw),
                        ("binding decode+greedy", greedy)):
        med = statistics.median(rates)
        print(f"{name:24s} {med:8.1f}  [{min(rates):.1f}-{max(rates):.1f}]  "
              f"ratio {med / base:.3f}")


if __name__ == "__main__":
    main()
