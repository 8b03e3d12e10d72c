#!/usr/bin/env python3
"""What offering tools costs a chat turn that calls none: llamapy against llama-server.

llamapy constrains an offered tool call with a lazy grammar (free text until the model opens
a call). This measures, per target, chat requests with four tools offered (``tools``), the
same tools with one schema the grammar converter cannot express so that llamapy sends them
unconstrained (``loose``: the grammar's own cost is ``tools`` against ``loose``), and none
(``plain``); same prompts, greedy, ``ignore_eos``, 128 tokens, non-streamed: the decode rate
each server reports in ``timings``, the prompt's tokens and the wall time per request. A
server that drops tools its chat template cannot show (llama-server with SmolLM2's) answers a
shorter prompt, which decodes faster: compare the prompt tokens. Targets run one at a time,
alternated by round (A B, then B A). Prints every round, then medians and ratios.

Needs ``python build_lib.py --with-server``. Usage:
``python bench/bench_tools_offered.py [--rounds 2] [--requests 8]`` (nothing else running).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections import defaultdict

import httpx
from http_load import Settings, byte_compile, llama_server_cmd, llamapy_cmd, start, stop

TOPICS = ("a cat", "the sea", "a lighthouse", "winter", "a train", "a garden", "the moon",
          "a market", "a river", "an old clock")


def _tool(name: str, properties: dict[str, object]) -> dict[str, object]:
    return {"type": "function", "function": {
        "name": name, "description": f"{name.replace('_', ' ')}",
        "parameters": {"type": "object", "properties": properties,
                       "required": sorted(properties)}}}


TOOLS: list[dict[str, object]] = [
    _tool("get_weather", {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}),
    _tool("search_files", {"pattern": {"type": "string"}, "limit": {"type": "integer"}}),
    _tool("read_file", {"path": {"type": "string"}}),
    _tool("run_command", {"command": {"type": "string"}, "timeout": {"type": "integer"}}),
]


def _loose() -> list[dict[str, object]]:
    """``TOOLS`` with one string ``format`` no grammar supports: sent unconstrained."""
    tools = copy.deepcopy(TOOLS)
    read = tools[2]["function"]
    read["parameters"]["properties"]["path"]["format"] = "no-such-format"  # type: ignore[index]
    return tools


KINDS = {"tools": TOOLS, "loose": _loose(), "plain": None}


def one(client: httpx.Client, topic: str, tools: list[dict[str, object]] | None,
        n_out: int) -> dict[str, float]:
    """One greedy chat request; the server's own decode and prompt rates, and wall time."""
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": f"Write a short story about {topic}."}],
        "max_tokens": n_out, "temperature": 0, "ignore_eos": True}
    if tools:
        body["tools"] = tools
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body, timeout=600)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    timings = r.json()["timings"]
    return {"decode_tps": timings["predicted_per_second"],
            "prompt_tps": timings["prompt_per_second"], "wall_s": wall,
            "tokens": timings["predicted_n"], "prompt_n": r.json()["usage"]["prompt_tokens"]}


def measure(port: int, requests: int, n_out: int) -> dict[str, list[dict[str, float]]]:
    """``requests`` prompts with tools and without, interleaved request by request."""
    out: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        one(client, "warm-up", None, 8)
        for i in range(requests):
            topic = TOPICS[i % len(TOPICS)] + f" (#{i})"
            order = list(KINDS) if i % 2 == 0 else list(reversed(KINDS))
            for kind in order:
                out[kind].append(one(client, topic, KINDS[kind], n_out))
    return out


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--n-out", type=int, default=128)
    args = p.parse_args()
    byte_compile()
    s = Settings()
    cmds = {"llama-server": llama_server_cmd(s), "llamapy": llamapy_cmd(s)}
    seen: dict[str, dict[str, list[dict[str, float]]]] = defaultdict(lambda: defaultdict(list))
    for rnd in range(args.rounds):
        order = list(cmds) if rnd % 2 == 0 else list(reversed(cmds))
        for target in order:
            proc, _ = start(cmds[target], s.port)
            try:
                rows = measure(s.port, args.requests, args.n_out)
            finally:
                stop(proc)
            for kind, values in rows.items():
                seen[target][kind] += values
                print(f"round {rnd + 1} {target:12s} {kind:5s} decode "
                      f"{median(values, 'decode_tps'):6.1f} tok/s  prompt "
                      f"{median(values, 'prompt_tps'):7.1f} tok/s  prompt "
                      f"{median(values, 'prompt_n'):4.0f} tokens  wall "
                      f"{median(values, 'wall_s'):5.2f} s", flush=True)
    print("\nmedians over all rounds: decode tok/s (prompt tokens)")
    for target, kinds in seen.items():
        cells = "   ".join(f"{kind} {median(rows, 'decode_tps'):6.1f} "
                           f"({median(rows, 'prompt_n'):.0f})" for kind, rows in kinds.items())
        grammar = median(kinds["tools"], "decode_tps") / median(kinds["loose"], "decode_tps")
        print(f"{target:12s} {cells}   tools/loose {grammar:.3f}")
    for kind in KINDS:
        ratio = (median(seen["llamapy"][kind], "decode_tps")
                 / median(seen["llama-server"][kind], "decode_tps"))
        print(f"llamapy / llama-server decode rate, {kind}: {ratio:.3f}")


if __name__ == "__main__":
    main()
