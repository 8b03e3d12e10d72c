"""Workspace Session hot loop against llama-server's ``/completion`` with ``cache_prompt``.

A 2,000-token stable prefix; 10 turns, each with a new 100-token suffix and 64 greedy tokens
decoded. Per-turn time to first token (TTFT), four series, each run as its own loop:

- session warm: one session, ``ensure_prefix`` (reuses the 2,000 resident prefix tokens),
  ``prefill_suffix``, ``decode``; TTFT from the ``ensure_prefix`` call to the first chunk.
- session cold: the same turn under a new manifest identity each time (a changed chat template
  digest), which forces a full prefill of prefix + suffix.
- llama-server warm: ``POST /completion`` with the prefix + suffix token ids,
  ``cache_prompt: true``, one slot (``-np 1``); TTFT from the request to the first streamed
  token with text.
- llama-server cold: the same with ``cache_prompt: false`` (a full prefill).

Both sides run the same llama.cpp build, model, n_ctx, n_batch/n_ubatch and threads. The
prefilled token counts are checked (warm turns must reuse the whole prefix, cold ones nothing).

Run: ``python bench/bench_session.py [--turns 10]`` (prints Markdown tables).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from bench_server import wait_healthy

from llamapy._paths import current_build
from llamapy._system import physical_cores
from llamapy.models import default_model_path
from llamapy.server import Server
from llamapy.session import DecodeConfig, PrefixInput, Session, SuffixInput

PREFIX_TOKENS, SUFFIX_TOKENS, DECODE_TOKENS = 2000, 100, 64
N_CTX, N_BATCH = 4096, 512


@dataclass(frozen=True, slots=True)
class Turn:
    """One measured turn: TTFT and the prompt tokens that were reused / computed."""

    ttft_s: float
    reused: int
    prefilled: int


Loop = Callable[[int], Turn]


def tokens_of(server: Server, text: str, n: int, add_bos: bool) -> tuple[int, ...]:
    """Exactly ``n`` tokens of repeated ``text``."""
    ids = server.tokenize(text * (n // 4 + 8), add_bos)
    return tuple(ids[:n])


def suffix_text(turn: int) -> str:
    """The volatile tail of ``turn`` (test output that changes every turn)."""
    return f" test_{turn} failed: assert handler(req_{turn}) == {turn * 7}\n"


def session_turn(session: Session, prefix: PrefixInput, suffix: tuple[int, ...]) -> Turn:
    """ensure_prefix + prefill_suffix + decode; TTFT to the first streamed chunk."""
    start = time.perf_counter()
    status = session.ensure_prefix(prefix)
    sfx = session.prefill_suffix(SuffixInput(token_ids=suffix))
    ttft = None
    for chunk in session.decode(DecodeConfig(max_tokens=DECODE_TOKENS, temperature=0.0)):
        assert chunk.error is None, chunk.error
        if ttft is None:
            ttft = time.perf_counter() - start
    assert ttft is not None
    return Turn(ttft, status.reused_tokens + sfx.reused_tokens,
                status.prefilled_tokens + sfx.prefilled_tokens)


def llama_server_turn(url: str, token_ids: list[int], cache_prompt: bool) -> Turn:
    """One streamed ``/completion``; TTFT to the first token with text."""
    body = {"prompt": token_ids, "n_predict": DECODE_TOKENS, "temperature": 0.0,
            "stream": True, "cache_prompt": cache_prompt}
    start = time.perf_counter()
    ttft, timings = None, {}
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=300) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if ttft is None and data.get("content"):
                ttft = time.perf_counter() - start
            if data.get("stop"):
                timings = data.get("timings", {})
                break
    assert ttft is not None and timings, "llama-server streamed no text"
    return Turn(ttft, int(timings.get("cache_n", -1)), int(timings.get("prompt_n", -1)))


def start_llama_server(threads: int, port: int) -> subprocess.Popen[bytes]:
    """llama-server from the same build, one slot, the Server's settings."""
    build = current_build()
    assert build, "no llama.cpp build: run python build_lib.py"
    exe = Path(build["lib_dir"]) / "llama-server"
    cmd = [str(exe), "-m", str(default_model_path()), "-c", str(N_CTX), "-np", "1",
           "-b", str(N_BATCH), "-ub", str(N_BATCH), "-t", str(threads), "-tb", str(threads),
           "-fa", "auto", "--host", "127.0.0.1", "--port", str(port)]
    return wait_healthy(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL), port)


def run_loop(name: str, turns: int, loop: Loop, check: Callable[[Turn], bool]) -> list[Turn]:
    """``turns`` turns of ``loop``; each must pass ``check`` (reuse as expected)."""
    out = []
    for i in range(turns):
        turn = loop(i)
        assert check(turn), f"{name} turn {i}: unexpected reuse {turn}"
        out.append(turn)
        print(f"  {name} {i}: {turn.ttft_s * 1e3:.1f} ms (reused {turn.reused}, "
              f"prefilled {turn.prefilled})", flush=True)
    return out


def session_series(args: argparse.Namespace) -> tuple[list[Turn], list[Turn], list[list[int]]]:
    """(warm, cold) session turns, and each turn's prefix + suffix token ids."""
    with Server(default_model_path(), n_ctx=N_CTX, n_parallel=1, n_batch=N_BATCH,
                n_ubatch=N_BATCH, n_threads=args.threads) as server:
        server.wait_ready(120)
        prefix_ids = tokens_of(server, "def handler(request): return route(request)\n",
                               PREFIX_TOKENS, True)
        suffixes = [tokens_of(server, suffix_text(i), SUFFIX_TOKENS, False)
                    for i in range(args.turns)]
        prompts = [list(prefix_ids + s) for s in suffixes]
        with server.open_session() as s:
            prefix = PrefixInput(token_ids=prefix_ids)
            session_turn(s, prefix, tokens_of(server, " warmup", SUFFIX_TOKENS, False))
            warm = run_loop("session warm", args.turns,
                            lambda i: session_turn(s, prefix, suffixes[i]),
                            lambda t: t.reused >= PREFIX_TOKENS)

            def cold_turn(i: int) -> Turn:
                manifest = s.base_manifest.replace(chat_template_digest=f"cold-{i}")
                return session_turn(s, PrefixInput(token_ids=prefix_ids, manifest=manifest),
                                    suffixes[i])

            cold = run_loop("session cold", args.turns, cold_turn, lambda t: t.reused == 0)
    return warm, cold, prompts


def llama_server_series(args: argparse.Namespace, prompts: list[list[int]]
                        ) -> tuple[list[Turn], list[Turn]]:
    """(warm, cold) llama-server turns on the same prompts."""
    proc = start_llama_server(args.threads, args.port)
    url = f"http://127.0.0.1:{args.port}"
    try:
        warmup = prompts[0][:PREFIX_TOKENS] + [prompts[0][-1]] * SUFFIX_TOKENS
        llama_server_turn(url, warmup, True)
        warm = run_loop("llama-server warm", len(prompts),
                        lambda i: llama_server_turn(url, prompts[i], True),
                        lambda t: t.reused >= PREFIX_TOKENS)
        cold = run_loop("llama-server cold", len(prompts),
                        lambda i: llama_server_turn(url, prompts[i], False),
                        lambda t: t.prefilled >= PREFIX_TOKENS + SUFFIX_TOKENS - 1)
    finally:
        proc.terminate()
        proc.wait(30)
    return warm, cold


def ms(turn: Turn | float) -> str:
    """Milliseconds, one decimal."""
    return f"{(turn.ttft_s if isinstance(turn, Turn) else turn) * 1e3:.1f}"


def print_table(series: dict[str, list[Turn]]) -> None:
    """Per-turn TTFT of the four series, a median row, the reuse counts."""
    sw, sc, lw, lc = (series[k] for k in ("sw", "sc", "lw", "lc"))
    print("\n| turn | session cold | session warm | warm speedup | llama-server cold | "
          "llama-server warm | warm: llama-server / session |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for i in range(len(sw)):
        print(f"| {i} | {ms(sc[i])} | {ms(sw[i])} | {sc[i].ttft_s / sw[i].ttft_s:.1f}x | "
              f"{ms(lc[i])} | {ms(lw[i])} | {lw[i].ttft_s / sw[i].ttft_s:.2f} |")
    med = {k: statistics.median(t.ttft_s for t in v) for k, v in series.items()}
    print(f"| median | {ms(med['sc'])} | {ms(med['sw'])} | {med['sc'] / med['sw']:.1f}x | "
          f"{ms(med['lc'])} | {ms(med['lw'])} | {med['lw'] / med['sw']:.2f} |")
    print("\n| series | reused tokens per turn | prefilled tokens per turn |\n|---|---|---|")
    names = {"sw": "session warm", "sc": "session cold", "lw": "llama-server warm",
             "lc": "llama-server cold"}
    for key, name in names.items():
        reused = sorted({t.reused for t in series[key]})
        filled = sorted({t.prefilled for t in series[key]})
        print(f"| {name} | {', '.join(map(str, reused))} | {', '.join(map(str, filled))} |")


def main() -> None:
    """Run the four series and print the tables."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--port", type=int, default=18182)
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}", flush=True)
    sw, sc, prompts = session_series(args)
    lw, lc = llama_server_series(args, prompts)
    print(f"load after: {os.getloadavg()}")
    print_table({"sw": sw, "sc": sc, "lw": lw, "lc": lc})


if __name__ == "__main__":
    main()
