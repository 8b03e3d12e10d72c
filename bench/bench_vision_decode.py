"""Decode speed before, during and after an image turn: a server that has taken one image must
stream text as fast as before it, that turn and every later one.

The default model (SmolLM2-135M) with the tiny vision projector of
``llamapy.testing.tiny_mmproj_path``, one slot, ``-t`` threads. Each round starts each target
on a fresh process (alternated round by round) and streams, greedily with ``ignore_eos``,
``--before`` text requests, one image turn (a question and a new image), then ``--after`` text
requests, each ``--max-tokens`` long. Per request: the median gap between its streamed tokens
(one a chunk with one slot; its decode rate without its prompt, robust to a burst of other work
on a shared machine), its mean ms a token after the first, and the server's voluntary context
switches a token (Linux; a decode whose threads sleep in its barriers instead of spinning
switches hundreds of times a token). Each phase reports the median over its requests.
Targets: ``llamapy.serve`` from this checkout; with ``--checkout DIR`` the same from another
checkout (the code before a change); ``llama-server`` when ``build_lib.py --with-server``
built it.

    python bench/bench_vision_decode.py --rounds 3 [--checkout DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from bench_vision import PORT, image, user_turn
from http_load import byte_compile, start, stop

from llamapy._paths import current_build
from llamapy.models import default_model_path
from llamapy.testing import tiny_mmproj_path

PHASES = ("before", "image", "after")


def commands(threads: int, checkout: str | None) -> dict[str, tuple[list[str], str | None]]:
    """Each target's command line and working directory (the same model, projector, context,
    one slot, threads)."""
    model = str(default_model_path())
    common = ["--port", str(PORT), "--host", "127.0.0.1", "-t", str(threads), "-c", "4096",
              "-np", "1", "--mmproj", str(tiny_mmproj_path())]
    ours = [sys.executable, "-m", "llamapy.serve", "--model", model, "--log-level", "warning",
            *common]
    targets: dict[str, tuple[list[str], str | None]] = {"llamapy.serve": (ours, None)}
    if checkout:
        targets["checkout"] = (ours, checkout)
    build = current_build()
    server = Path(build["lib_dir"]) / "llama-server" if build else None
    if server is not None and server.exists():
        targets["llama-server"] = ([str(server), "-m", model, *common], None)
    return targets


def switches(pid: int) -> int:
    """The voluntary context switches of ``pid``'s threads so far (Linux): a thread that sleeps
    in a barrier instead of spinning switches once a barrier."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:  # the thread ended
            continue
        total += next(int(line.split()[1]) for line in text.splitlines()
                      if line.startswith("voluntary_ctxt_switches"))
    return total


def one_turn(client: httpx.Client, pid: int, content: object,
             max_tokens: int) -> dict[str, float]:
    """One greedy streamed chat turn of ``max_tokens``: the median gap between its tokens
    (``gap``), its mean ms a token after the first (``mean``) and the server's voluntary
    context switches a token (``csw``)."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    arrivals: list[float] = []
    n, before = 0, switches(pid)
    with client.stream("POST", "/v1/chat/completions", json=body,
                       headers={"Connection": "close"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                arrivals.append(time.perf_counter())
            n = (chunk.get("usage") or {}).get("completion_tokens", n)
    assert n == max_tokens, f"{n} tokens streamed, {max_tokens} asked"
    return {"gap": 1e3 * statistics.median(b - a for a, b in itertools.pairwise(arrivals)),
            "mean": 1e3 * (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1),
            "csw": (switches(pid) - before) / n}


def one_round(cmd: list[str], cwd: str | None, args: argparse.Namespace,
              serial: int) -> dict[str, list[dict[str, float]]]:
    """Each phase's turns."""
    proc, _ = start(cmd, PORT, cwd=cwd)
    out: dict[str, list[dict[str, float]]] = {phase: [] for phase in PHASES}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=300) as client:
            one_turn(client, proc.pid, "Warm up.", 8)
            for k in range(args.before):
                out["before"].append(one_turn(client, proc.pid, f"Tell story {k}.",
                                              args.max_tokens))
            turn = user_turn("What is in this image?", image(serial))["content"]
            out["image"].append(one_turn(client, proc.pid, turn, args.max_tokens))
            for k in range(args.after):
                out["after"].append(one_turn(client, proc.pid, f"Tell tale {k}.",
                                             args.max_tokens))
    finally:
        stop(proc)
    return out


def phase(turns: list[dict[str, float]], metric: str) -> float:
    """A phase's median of ``metric`` over its turns."""
    return statistics.median(t[metric] for t in turns)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", type=int, default=3)
    ap.add_argument("--after", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--checkout", help="another llamapy checkout to run as a target")
    args = ap.parse_args()
    targets = commands(args.threads, args.checkout)
    for cwd in {cwd for _, cwd in targets.values()}:
        byte_compile(cwd)
    results: dict[str, list[dict[str, list[dict[str, float]]]]] = {n: [] for n in targets}
    for r in range(args.rounds):
        order = list(targets) if r % 2 == 0 else list(targets)[::-1]
        for name in order:
            cmd, cwd = targets[name]
            res = one_round(cmd, cwd, args, serial=100 * r + len(results[name]))
            results[name].append(res)
            print(f"round {r} {name:14} " + "  ".join(
                f"{p} {phase(res[p], 'gap'):5.2f} ms ({phase(res[p], 'mean'):5.2f} mean, "
                f"{phase(res[p], 'csw'):5.1f} csw)" for p in PHASES), flush=True)
    report(results)
    return 0


def report(results: dict[str, list[dict[str, list[dict[str, float]]]]]) -> None:
    """Per target and metric: each phase's median over rounds, the rounds' range, and the
    after / before ratio."""
    print("\n| target | metric | before | image turn | after | after / before |\n"
          "|---|---|---|---|---|---|")
    for name, rounds in results.items():
        for metric in ("gap", "mean", "csw"):
            per = {p: [phase(r[p], metric) for r in rounds] for p in PHASES}
            cells = [f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
                     for v in per.values()]
            ratios = [a / max(b, 1e-9) for a, b in zip(per["after"], per["before"], strict=True)]
            print(f"| {name} | {metric} | {' | '.join(cells)} | {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    sys.exit(main())
