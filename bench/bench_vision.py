"""Images in a conversation against llama-server, same build, same model and projector: the
first turn's time to first token, the second turn's (which resends the image), and a fresh
conversation with another image.

Both servers run the default model (SmolLM2-135M) with the tiny vision projector of
``llamapy.testing.tiny_mmproj_path`` (16 embeddings an image, arbitrary weights), one at a
time, alternated round by round, each on a fresh process. Each round runs ``--convs``
conversations: a ~``--system-words`` system prompt, then turn 1 (a question and an image no
earlier conversation sent), turn 2 (turn 1, its answer and a follow-up: the image is sent
again), and turn 3 (a new conversation with turn 1's text and another new image). Each turn
streams greedily; TTFT is the wall time to the first content chunk, and the reused prompt
tokens come from the final chunk (``usage.prompt_tokens_details.cached_tokens`` here,
``timings.cache_n`` from llama-server). The turn-1 answers of both servers are compared: the
same image and prompt should give the same greedy text.

    python bench/bench_vision.py --rounds 4 --convs 6
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import sys
import time
from pathlib import Path

import httpx
from http_load import WORDS, start, stop

from llamapy._paths import current_build
from llamapy.media.samples import png
from llamapy.models import default_model_path
from llamapy.testing import tiny_mmproj_path

PORT = 18198


def commands(threads: int) -> dict[str, list[str]]:
    """Each target's command line (the same model, projector, context, slots, threads)."""
    build = current_build()
    assert build, "run python build_lib.py --with-server"
    common = ["--port", str(PORT), "--host", "127.0.0.1", "-t", str(threads), "-c", "8192",
              "-np", "2", "--mmproj", str(tiny_mmproj_path())]
    model = str(default_model_path())
    return {"llama-server": [str(Path(build["lib_dir"]) / "llama-server"), "-m", model,
                             *common],
            "llamapy.serve": [sys.executable, "-m", "llamapy.serve", "--model", model,
                              "--log-level", "warning", *common]}


def image(serial: int) -> str:
    """A data URL of an image no other serial gives."""
    rgb = (serial * 37 % 256, serial * 91 % 256, serial * 53 % 256)
    return "data:image/png;base64," + base64.b64encode(png(32 + serial % 7, 32, rgb)).decode()


def user_turn(text: str, url: str) -> dict[str, object]:
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        {"type": "image_url", "image_url": {"url": url}}]}


def stream(client: httpx.Client, messages: list[dict[str, object]]) -> tuple[float, int, str]:
    """TTFT (s), reused prompt tokens and the answer of one greedy streamed turn."""
    body = {"messages": messages, "max_tokens": 16, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    started, ttft, cached, text = time.perf_counter(), 0.0, -1, []
    # one connection a turn: llama-server may drop a kept-alive one after a stream
    with client.stream("POST", "/v1/chat/completions", json=body,
                       headers={"Connection": "close"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft or time.perf_counter() - started
                    text.append(piece)
            usage = chunk.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens", cached)
            cached = chunk.get("timings", {}).get("cache_n", cached)
    return ttft, cached, "".join(text)


def one_round(cmd: list[str], system: str, convs: int, first: int) -> dict[str, list]:
    """Each turn's TTFTs and reused tokens, and the turn-1 answers, over ``convs``
    conversations with images numbered from ``first``."""
    proc, _ = start(cmd, PORT)
    out: dict[str, list] = {"t1": [], "t2": [], "t3": [], "c1": [], "c2": [], "c3": [],
                            "answers": []}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=120) as client:
            stream(client, [{"role": "system", "content": system},
                            user_turn("Warm up.", image(10_000 + first))])
            for k in range(convs):
                question = f"Conversation {k}: what is in this image?"
                turn = [{"role": "system", "content": system},
                        user_turn(question, image(first + 2 * k))]
                t1, c1, answer = stream(client, turn)
                turn += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": "And what colour is it?"}]
                t2, c2, _ = stream(client, turn)
                t3, c3, _ = stream(client, [{"role": "system", "content": system},
                                            user_turn(question, image(first + 2 * k + 1))])
                for key, value in (("t1", t1), ("t2", t2), ("t3", t3), ("c1", c1),
                                   ("c2", c2), ("c3", c3), ("answers", answer)):
                    out[key].append(value)
    finally:
        stop(proc)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--convs", type=int, default=6)
    ap.add_argument("--system-words", type=int, default=600)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    targets = commands(args.threads)
    rng = random.Random(7)
    system = " ".join(rng.choice(WORDS) for _ in range(args.system_words))
    results: dict[str, list[dict[str, list]]] = {name: [] for name in targets}
    for r in range(args.rounds):
        order = list(targets) if r % 2 == 0 else list(targets)[::-1]
        for name in order:
            res = one_round(targets[name], system, args.convs, first=1000 * r)
            results[name].append(res)
            print(f"round {r} {name:14} TTFT ms t1 {1e3 * statistics.median(res['t1']):6.1f} "
                  f"t2 {1e3 * statistics.median(res['t2']):6.1f} "
                  f"t3 {1e3 * statistics.median(res['t3']):6.1f}  cached "
                  f"{res['c1'][0]}/{res['c2'][0]}/{res['c3'][0]}", flush=True)
    report(results)
    return 0


def report(results: dict[str, list[dict[str, list]]]) -> None:
    """The table of medians and the ratios, round by round."""
    print("\n| target | TTFT turn 1 ms | turn 2 (image resent) ms | turn 3 (other image) ms "
          "| turn 2 / turn 1 | reused t1/t2/t3 |\n|---|---|---|---|---|---|")
    medians = {}
    for name, rounds in results.items():
        t = {k: [1e3 * statistics.median(r[k]) for r in rounds] for k in ("t1", "t2", "t3")}
        medians[name] = t
        reuse = "/".join(str(rounds[0][c][0]) for c in ("c1", "c2", "c3"))
        ratio = statistics.median(b / a for a, b in zip(t["t1"], t["t2"], strict=True))
        print(f"| {name} | {statistics.median(t['t1']):.1f} | {statistics.median(t['t2']):.1f}"
              f" | {statistics.median(t['t3']):.1f} | {ratio:.3f} | {reuse} |")
    ours, peer = medians["llamapy.serve"], medians["llama-server"]
    for k in ("t1", "t2", "t3"):
        ratios = [a / b for a, b in zip(ours[k], peer[k], strict=True)]
        print(f"llamapy / llama-server TTFT {k}: median {statistics.median(ratios):.2f} "
              f"(rounds {', '.join(f'{x:.2f}' for x in ratios)})")
    same = [a == b for a, b in zip(results["llamapy.serve"][0]["answers"],
                                   results["llama-server"][0]["answers"], strict=True)]
    print(f"turn-1 greedy answers equal to llama-server's: {sum(same)}/{len(same)}")
    print("llamapy:", results["llamapy.serve"][0]["answers"][:2])
    print("llama-server:", results["llama-server"][0]["answers"][:2])


if __name__ == "__main__":
    sys.exit(main())
