#!/usr/bin/env python3
"""What a served token costs besides its decode: the gap between two ``llama_decode`` calls.

Starts ``python -m llamapy.serve`` (this checkout, or ``--checkout``) with
``Context.decode`` wrapped to record, per decode, the wall time since the previous decode
returned (the gap: the tick thread's Python, sampling, and any wait for the GIL), the tick
thread's CPU time in that gap, and the decode's own wall time. Runs ``--waves`` waves of
``--streams`` streamed ``/v1/completions`` (~100-token prompts, 64 tokens out, ``ignore_eos``),
then reports over the decode-only steps (one token per stream): gap median and mean, gap CPU
median, decode median, and the event loop thread's CPU per generated token (``/proc``).

A gap longer than its CPU time is time the tick thread waited, mostly for the GIL held by the
event loop thread. Usage: ``python bench/probe_decode_gap.py [--streams 1] [--waves 8]
[--checkout DIR] [--env NAME=VALUE ...]`` (run nothing else on the machine meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import runpy
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def serve_wrapped(out: str, serve_args: list[str]) -> None:
    """The child: ``llamapy.serve`` with ``Context.decode`` timed; the records go to ``out``
    as JSON on SIGTERM: ``[gap_s, gap_cpu_s, decode_s, n_tokens]`` per decode."""
    sys.path.insert(0, os.getcwd())  # the checkout to probe (run with it as cwd)
    from llamapy._native import context

    records: list[list[float]] = []
    last: list[float] = []  # [wall, thread CPU] when the previous decode returned
    decode = context.Context.decode

    def timed(self: context.Context, batch: context.Batch) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        n = batch.n_tokens
        decode(self, batch)
        if last:
            records.append([t0 - last[0], c0 - last[1], time.perf_counter() - t0, n])
        last[:] = [time.perf_counter(), time.thread_time()]

    def dump(*_: object) -> None:
        Path(out).write_text(json.dumps(records))
        os._exit(0)

    context.Context.decode = timed  # type: ignore[method-assign]
    signal.signal(signal.SIGTERM, dump)
    sys.argv = ["llamapy.serve", *serve_args]
    runpy.run_module("llamapy.serve", run_name="__main__")


def thread_cpu(pid: int, tid: int) -> float:
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def drive(args: argparse.Namespace) -> None:
    from http_load import Settings, byte_compile, llamapy_cmd, prompts_for, start, wave

    checkout = str(Path(args.checkout).resolve()) if args.checkout else None
    byte_compile(checkout)
    s = Settings()
    out = Path(tempfile.mkdtemp()) / "gaps.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(out), "--",
           *llamapy_cmd(s)[3:]]
    env = dict(pair.split("=", 1) for pair in args.env)
    proc, _ = start(cmd, s.port, cwd=checkout, env=env)
    try:
        asyncio.run(wave(s.port, prompts_for(args.streams, 1, "warm"), 8))
        cpu0, t0, tokens = thread_cpu(proc.pid, proc.pid), time.perf_counter(), 0
        for k in range(args.waves):
            tokens += asyncio.run(wave(s.port, prompts_for(args.streams, 100 + k, "gap"),
                                       64)).tokens
        wall, loop_cpu = time.perf_counter() - t0, thread_cpu(proc.pid, proc.pid) - cpu0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    steps = [r for r in json.loads(out.read_text()) if r[3] == args.streams]
    gap, cpu, dec = ([1e3 * r[i] for r in steps] for i in range(3))
    print(f"streams {args.streams}: {tokens / wall:.1f} tok/s, {len(steps)} decode-only steps; "
          f"gap median {statistics.median(gap):.3f} ms, mean {statistics.mean(gap):.3f}; "
          f"gap CPU median {statistics.median(cpu):.3f} ms; decode median "
          f"{statistics.median(dec):.2f} ms; event loop thread CPU "
          f"{1e3 * loop_cpu / tokens:.3f} ms a token")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        serve_wrapped(sys.argv[2], sys.argv[4:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--waves", type=int, default=8)
    p.add_argument("--checkout", help="probe the llamapy of this checkout instead")
    p.add_argument("--env", nargs="*", default=[], help="NAME=VALUE for the server")
    drive(p.parse_args())


if __name__ == "__main__":
    main()
