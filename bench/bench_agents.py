#!/usr/bin/env python3
"""Agent loops at equal work: ``python -m llamapy.serve`` against llama-server.

``--shape agents`` (default): K agents (``--agents 6``) x T turns (``--turns 4``), at most
``--slots`` requests in flight (4, the servers' ``n_parallel``; a turn waits for a place, first
come first served). Every agent sends the same ~680-token system prompt (``--system-words``
sets its size; a coding agent's, with its tools' documentation, is thousands) and offers the same 3
tools (JSON schemas). Turn 1 is the agent's task; each later turn appends the previous answer,
a tool call with fixed arguments and the tool's result (~100-180 words, its own per agent and
turn), then the model answers (greedy, at most 48 tokens, streamed). The history holds a fixed
synthetic answer, never the model's output, so both servers get the same request
(``--own-answers``: the model's own answers instead, as a real agent loop has them, whose KV a
server can reuse; the requests then differ by what each server answered). They need
not render the same prompt: with a chat template that knows no tools (SmolLM2's), llama-server
leaves the offered tools and the tool calls out of the prompt, llamapy.serve writes them in
(about 360 + 50 tokens). ``prompt_tokens`` shows it; ``--no-tools`` offers none and writes
each tool call into the answer's text, each result as a user turn: identical prompts.
``--api messages`` sends Anthropic ``/v1/messages`` through the ``anthropic`` client
(``metadata.user_id`` = the agent); ``--api responses`` the OpenAI Responses API through the
``openai`` client (``prompt_cache_key`` = the agent); both by default, one after the other.

TTFT is measured in the client: from sending to the first streamed output (a text, tool-input
or thinking delta, or a tool call's start). The cached share of prompt tokens (turns >= 2) is
read from each API's usage, the same field for both servers: ``cache_read_input_tokens /
(cache_read_input_tokens + input_tokens)`` for Messages, ``input_tokens_details.cached_tokens
/ input_tokens`` for Responses. Each run prints wall, output tokens, TTFT p50/p90 of turns >= 2
and of turn 1, the cached share and prompt tokens of turns >= 2; then medians over rounds, the
ratio second/first target of each, and all of it as JSON.

``--shape wave``: a cold wave of 8 concurrent ``/v1/completions`` on a shared ~500-token
prefix (wall, TTFT). ``--shape multiturn``: the workload of ``bench_multiturn.py`` (its own
sizes: 16 conversations x 4 turns, 4 in flight).

Each server runs alone (a fresh process per run) with its serving defaults, alternated per
round (A B, then B A). ``--baseline CHECKOUT`` compares with the ``llamapy.serve`` of another
checkout instead of llama-server; ``--extra-llamapy-args`` is appended to this checkout's
``llamapy.serve`` command line only.

Usage: ``python bench/bench_agents.py [--rounds 2] [--api messages|responses|both]``
(nothing else on the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agent_workload
import anthropic
import http_load
import openai
from agent_workload import (
    MAX_TOKENS,
    MODEL,
    RESPONSES_TOOLS,
    TOOLS,
    Turn,
    messages_input,
    responses_input,
    steps_of,
)
from http_load import Settings, byte_compile, start, stop, text_of, wave

Target = tuple[Callable[[Settings], list[str]], str | None]  # its command, the checkout


@dataclass(frozen=True, slots=True)
class Sample:
    """One streamed turn: time to first output, cached and total prompt tokens, output tokens."""

    ttft: float
    cached: int
    prompt: int
    output: int
    text: str = ""


@dataclass(slots=True)
class Run:
    """One workload against one server."""

    first: list[float] = field(default_factory=list)
    later: list[float] = field(default_factory=list)
    cached: int = 0
    prompt: int = 0
    output: int = 0
    wall_s: float = 0.0

    def add(self, turn: int, s: Sample) -> None:
        self.output += s.output
        if turn == 0:
            self.first.append(s.ttft)
            return
        self.later.append(s.ttft)
        self.cached += s.cached
        self.prompt += s.prompt

    def row(self) -> dict[str, float]:
        """The figures this run has (a shape without later turns has no later figures)."""
        out = {"wall_s": self.wall_s, **({"output_tokens": self.output} if self.output else {})}
        for label, xs in (("ttft", self.later), ("ttft_turn1", self.first)):
            if xs:
                out[f"{label}_p50"], out[f"{label}_p90"] = q(xs, 0.5), q(xs, 0.9)
        if self.prompt:  # equal work: both servers should count about the same prompt tokens
            out["cached_pct"] = 100 * self.cached / self.prompt
            out["prompt_tokens"] = self.prompt
        return out


def q(xs: list[float], p: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(p * len(ys)))]


def first_output(event: Any) -> bool:
    """Whether a streamed event (either API) carries the first output of the answer."""
    kind = event.type
    if kind in ("content_block_delta", "response.output_text.delta",
                "response.function_call_arguments.delta", "response.reasoning_text.delta"):
        return True
    if kind == "content_block_start":
        return event.content_block.type == "tool_use"
    return kind == "response.output_item.added" and event.item.type == "function_call"


async def messages_turn(client: Any, turn: Turn) -> Sample:
    t0, ttft = time.perf_counter(), 0.0
    async with client.messages.stream(
            model=MODEL, max_tokens=MAX_TOKENS, system=agent_workload.SYSTEM,
            tools=TOOLS if turn.tools else anthropic.omit,
            messages=messages_input(turn), metadata={"user_id": turn.agent_id},
            extra_body={"temperature": 0.0}) as stream:
        async for event in stream:
            if not ttft and first_output(event):
                ttft = time.perf_counter() - t0
        final = await stream.get_final_message()
    ttft = ttft or time.perf_counter() - t0  # no output at all: the time to the end
    usage, cached = final.usage, final.usage.cache_read_input_tokens or 0
    text = "".join(b.text for b in final.content if b.type == "text")
    return Sample(ttft, cached, cached + usage.input_tokens, usage.output_tokens, text)


async def responses_turn(client: Any, turn: Turn) -> Sample:
    t0, ttft, usage, text = time.perf_counter(), 0.0, None, []
    stream = await client.responses.create(
        model=MODEL, instructions=agent_workload.SYSTEM, input=responses_input(turn),
        tools=RESPONSES_TOOLS if turn.tools else openai.omit, max_output_tokens=MAX_TOKENS,
        temperature=0.0, stream=True, prompt_cache_key=turn.agent_id)
    async with stream:
        async for event in stream:
            if not ttft and first_output(event):
                ttft = time.perf_counter() - t0
            if event.type == "response.output_text.delta":
                text.append(event.delta)
            if event.type in ("response.completed", "response.incomplete"):
                usage = event.response.usage
    if usage is None:
        raise RuntimeError("the stream ended without response.completed")
    ttft = ttft or time.perf_counter() - t0
    details = usage.input_tokens_details
    cached = (details.cached_tokens or 0) if details else 0
    return Sample(ttft, cached, usage.input_tokens, usage.output_tokens, "".join(text))


TurnFn = Callable[[Any, Turn], Awaitable[Sample]]


async def agent(turn_fn: TurnFn, client: Any, i: int, turns: int, tools: bool, own: bool,
                gate: asyncio.Semaphore, run: Run) -> None:
    task, steps = steps_of(i, turns)
    answers: list[str] = []
    for t in range(turns):
        async with gate:
            sample = await turn_fn(client, Turn(f"agent-{i}", task, steps[:t], tools,
                                                tuple(answers)))
        run.add(t, sample)
        if own:
            answers.append(sample.text)


async def agents_workload(port: int, api: str, args: argparse.Namespace) -> Run:
    if api == "messages":
        client: Any = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{port}",
                                               api_key="none", max_retries=1)
        turn_fn: TurnFn = messages_turn
    else:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                    max_retries=1)
        turn_fn = responses_turn
    run, gate = Run(), asyncio.Semaphore(args.slots)
    async with client:
        t0 = time.perf_counter()
        await asyncio.gather(*(agent(turn_fn, client, i, args.turns, not args.no_tools,
                                     args.own_answers, gate, run)
                               for i in range(args.agents)))
        run.wall_s = time.perf_counter() - t0
    return run


async def wave_workload(port: int) -> Run:
    """8 concurrent completions on one ~500-token prefix, 32 tokens each, on a cold server."""
    prefix = "Shared context: " + text_of(random.Random(500), 490)
    prompts = [f"{prefix}\nQuestion {k}: " + text_of(random.Random(600 + k), 20)
               for k in range(8)]
    w = await wave(port, prompts, 32)
    return Run(later=w.ttfts, wall_s=w.wall_s)


async def multiturn_workload(port: int) -> Run:
    from bench_multiturn import workload
    t = await workload(port, sticky=False)
    return Run(later=t.ttfts, cached=t.cached, prompt=t.prompt, wall_s=t.wall_s)


def workloads(args: argparse.Namespace) -> dict[str, Callable[[int], Coroutine[Any, Any, Run]]]:
    """The named workloads to run, each a coroutine function of the server's port."""
    if args.shape == "wave":
        return {"wave": wave_workload}
    if args.shape == "multiturn":
        return {"multiturn": multiturn_workload}
    apis = ["messages", "responses"] if args.api == "both" else [args.api]

    def one(api: str) -> Callable[[int], Coroutine[Any, Any, Run]]:
        return lambda port: agents_workload(port, api, args)
    return {f"agents/{api}": one(api) for api in apis}


def targets_of(args: argparse.Namespace) -> dict[str, Target]:
    extra = shlex.split(args.extra_llamapy_args)
    targets: dict[str, Target] = {
        "llama-server": (http_load.llama_server_cmd, None),
        "llamapy.serve": (lambda s: http_load.llamapy_cmd(s) + extra, None)}
    if args.baseline:
        byte_compile(args.baseline)
        del targets["llama-server"]
        targets = {f"llamapy {Path(args.baseline).name}": (http_load.llamapy_cmd, args.baseline),
                   **targets}
    names = [n for n in args.targets.split(",") if n] if args.targets else list(targets)
    unknown = set(names) - set(targets)
    if unknown:
        raise SystemExit(f"unknown targets {sorted(unknown)}; known: {list(targets)}")
    return {n: targets[n] for n in names}


def run_once(target: Target, s: Settings, fn: Callable[[int], Coroutine[Any, Any, Run]]) -> Run:
    cmd, checkout = target
    proc, _ = start(cmd(s), s.port, cwd=checkout)
    try:
        return asyncio.run(fn(s.port))
    finally:
        stop(proc)


def num(key: str, v: float) -> str:
    return f"{v:.0f}" if key.endswith("_tokens") else f"{v:.1f}" if key == "cached_pct" else \
        f"{v:.3f}"


def fmt(row: dict[str, float]) -> str:
    return "  ".join(f"{k} {num(k, v)}" for k, v in row.items())


def summary(rows: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Medians over rounds per target, and each figure's ratio second/first target."""
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for n, rs in rows.items()}
    names = list(rows)
    out: dict[str, Any] = {"median": med}
    if len(names) == 2:
        a, b = med[names[0]], med[names[1]]
        out["ratio"] = {k: b[k] / a[k] for k in a if a[k]}
        out["ratio_of"] = f"{names[1]} / {names[0]}"
    return out


def table(name: str, summ: dict[str, Any]) -> None:
    names = list(summ["median"])
    ratio = summ.get("ratio", {})
    print(f"\n| {name} (median) | " + " | ".join(names) + " | ratio |")
    print("|---" * (len(names) + 2) + "|")
    for k in summ["median"][names[0]]:
        cells = " | ".join(num(k, summ["median"][n][k]) for n in names)
        print(f"| {k} | {cells} | {ratio.get(k, float('nan')):.2f} |")
    if abs(ratio.get("prompt_tokens", 1.0) - 1) > 0.05:
        print("unequal work: the servers count different prompt tokens (see --no-tools)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--shape", choices=["agents", "wave", "multiturn"], default="agents")
    p.add_argument("--api", choices=["messages", "responses", "both"], default="both")
    p.add_argument("--agents", type=int, default=6)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--slots", type=int, default=4, help="n_parallel and requests in flight")
    p.add_argument("--no-tools", action="store_true",
                   help="offer no tools; write each tool call into the answer's text and each "
                        "result as a user turn (identical prompts on both servers)")
    p.add_argument("--own-answers", action="store_true",
                   help="the history holds the model's own answers, as in a real agent loop "
                        "(their KV can be reused; the servers' prompts then differ by the "
                        "greedy answers they gave)")
    p.add_argument("--system-words", type=int, default=610,
                   help="words of project notes in the system prompt (610: ~680 tokens)")
    p.add_argument("--n-ctx", type=int, default=Settings().n_ctx,
                   help="context of both servers (a larger system prompt needs more)")
    p.add_argument("--port", type=int, default=Settings().port)
    p.add_argument("--targets", default="", help="comma-separated subset, in this order")
    p.add_argument("--extra-llamapy-args", default="",
                   help="appended to this checkout's llamapy.serve command line")
    p.add_argument("--baseline", metavar="CHECKOUT",
                   help="compare with the llamapy.serve of this checkout, not llama-server")
    args = p.parse_args()
    byte_compile()
    agent_workload.SYSTEM = agent_workload.system_prompt(args.system_words)
    targets, s = targets_of(args), Settings(n_parallel=args.slots, port=args.port,
                                            n_ctx=args.n_ctx)
    report: dict[str, Any] = {"settings": {**vars(args), "n_ctx": s.n_ctx,
                                           "threads": s.threads}, "workloads": {}}
    for wname, fn in workloads(args).items():
        rows: dict[str, list[dict[str, float]]] = {n: [] for n in targets}
        order = list(targets)
        for rnd in range(args.rounds):
            for name in (order if rnd % 2 == 0 else order[::-1]):
                row = run_once(targets[name], s, fn).row()
                rows[name].append(row)
                print(f"{wname} round {rnd} {name:15s} {fmt(row)}", flush=True)
        summ = summary(rows)
        table(wname, summ)
        report["workloads"][wname] = {"rounds": rows, **summ}
    print("\n" + json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
