"""Simulation benchmark of the engine on the fake backend's cost model (no model, no GPU).

Simulated time only: the fake backend advances a clock by ``CostModel`` per decode, so figures
are deterministic and compare scheduling policies, not hardware. Scenarios:

1. uniform load: 32 requests, 128-token prompts, 64 tokens out, Poisson arrivals (12/s);
2. a wave of 8 requests sharing a 494-token prefix (prefill tokens with/without in-flight dedup);
3. interleaved multi-turn conversations exceeding the slot count (reuse with/without RAM cache);
4. mixed long prompts and short streaming decodes (p99 inter-token delay per strategy);
5. agent loops: 6 agents x 5 turns on 4 slots, a shared 650-token system prompt, each turn
   appending an answer and a ~150-token tool result after a 0.5-2 s tool-call gap (TTFT per
   strategy).

Run ``python bench/sim_engine.py`` to print the tables; ``--write`` also replaces the
"Simulation (fake backend)" section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import heapq
import random
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llamapy.engine import (
    CostModel,
    DoneEvent,
    Engine,
    EngineConfig,
    EngineTuning,
    ErrorEvent,
    FakeBackend,
    FakeModel,
    Request,
    RequestOptions,
    SamplingParams,
    SimClock,
    TokenEvent,
)

#: A CPU-class small model: 6 ms per pass, 0.8 ms per batch token, attention 2 us per cell read.
COST = CostModel(step_s=0.006, token_s=0.0008, ctx_token_s=0.000002, restore_byte_s=1e-9)
MODEL = FakeModel(n_vocab=1000, eog_permille=0)  # no early EOG: every request runs to max_tokens
STRATEGIES = ("decode_maximal", "prefill_priority", "balanced", "shortest_first")


@dataclass
class Trace:
    """Timestamps of one request."""

    submitted: float
    tokens: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    done: DoneEvent | ErrorEvent | None = None

    @property
    def ttft(self) -> float:
        return self.tokens[0] - self.submitted

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.tokens, self.tokens[1:], strict=False)]


class Sim:
    """An engine on a fake backend driven by timed submissions."""

    def __init__(self, *, n_parallel: int = 4, n_ctx: int = 16384, unified: bool = True,
                 bytes_per_token: int = 2048, tuning: EngineTuning | None = None,
                 **config: object) -> None:
        self.clock = SimClock()
        self.backend = FakeBackend(n_ctx=n_ctx, n_seq_max=n_parallel, n_batch=4096,
                                   kv_unified=unified, model=MODEL, cost=COST, clock=self.clock,
                                   state_bytes_per_token=bytes_per_token)
        cfg = EngineConfig(n_parallel=n_parallel, kv_unified=unified, **config)  # type: ignore[arg-type]
        self.engine = Engine(self.backend, cfg, tuning=tuning, clock=self.clock.now)
        self.traces: dict[object, Trace] = {}
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._n = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at simulated time ``t``."""
        self._n += 1
        heapq.heappush(self._timers, (t, self._n, fn))

    def submit(self, rid: object, prompt: list[int], max_tokens: int,
               on_done: Callable[[Trace], None] | None = None, **options: object) -> None:
        trace = Trace(self.clock.now())
        self.traces[rid] = trace

        def sink(event: object) -> None:
            if isinstance(event, TokenEvent):
                trace.tokens.append(self.clock.now())
                trace.token_ids.append(event.token_id)
            elif isinstance(event, DoneEvent | ErrorEvent):
                trace.done = event
                if on_done is not None:
                    on_done(trace)

        opts = RequestOptions(max_tokens=max_tokens, sampling=SamplingParams(seed=1), **options)  # type: ignore[arg-type]
        self.engine.submit(Request(rid, prompt, opts, sink))

    def run(self) -> float:
        """Run until no work and no timers are left; returns the simulated makespan."""
        while self._timers or self.engine.has_work:
            while self._timers and self._timers[0][0] <= self.clock.now():
                heapq.heappop(self._timers)[2]()
            if self.engine.has_work:
                self.engine.tick()
            elif self._timers:
                self.clock.t = self._timers[0][0]
        return self.clock.now()

    # --- metrics -----------------------------------------------------------------------------

    def generated(self) -> int:
        return sum(len(t.tokens) for t in self.traces.values())

    def ttfts(self) -> list[float]:
        return [t.ttft for t in self.traces.values() if t.tokens]

    def gaps(self, rids: object = None) -> list[float]:
        chosen = self.traces.values() if rids is None else [self.traces[r] for r in rids]
        return [g for t in chosen for g in t.gaps]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def rand_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, MODEL.n_vocab) for _ in range(n)]


# --- scenarios ---------------------------------------------------------------------------------


def uniform(strategy: str) -> dict[str, float]:
    rng = random.Random(1)
    sim = Sim(batch_strategy=strategy)
    t = 0.0
    for i in range(32):
        t += rng.expovariate(12.0)
        prompt = rand_tokens(rng, 128)
        sim.at(t, lambda i=i, p=prompt: sim.submit(i, p, 64))
    makespan = sim.run()
    return {"tok/s": sim.generated() / makespan, "ttft mean": statistics.mean(sim.ttfts()),
            "ttft p99": pct(sim.ttfts(), 0.99), "itl p99": pct(sim.gaps(), 0.99)}


def wave(dedup: bool, strategy: str = "decode_maximal") -> dict[str, float]:
    rng = random.Random(2)
    sim = Sim(n_parallel=8, tuning=EngineTuning(inflight_dedup=dedup), batch_strategy=strategy)
    prefix = rand_tokens(rng, 494)
    for i in range(8):
        sim.submit(i, prefix + rand_tokens(rng, 16), 64)
    makespan = sim.run()
    c = sim.engine.counters
    return {"prefill tokens": c.num_prefill_tokens, "wall s": makespan,
            "ttft mean": statistics.mean(sim.ttfts()), "ttft max": max(sim.ttfts())}


def conversations(ram_mb: float, n_conv: int = 8, turns: int = 6) -> dict[str, float]:
    rng = random.Random(3)
    sim = Sim(n_parallel=4, unified=False, n_ctx=4 * 2048, prompt_cache_ram_mb=ram_mb,
              tuning=EngineTuning(ram_min_tokens=32))
    history = {c: rand_tokens(rng, 300) for c in range(n_conv)}

    def turn(conv: int, k: int) -> None:
        prompt = history[conv] + rand_tokens(rng, 40)

        def done(trace: Trace, conv: int = conv, k: int = k, prompt: list[int] = prompt) -> None:
            history[conv] = prompt + trace.token_ids
            if k + 1 < turns:
                sim.at(sim.clock.now() + rng.uniform(0.5, 3.0), lambda: turn(conv, k + 1))

        sim.submit((conv, k), prompt, 32, on_done=done)

    for conv in range(n_conv):
        sim.at(rng.uniform(0, 2.0), lambda conv=conv: turn(conv, 0))
    makespan = sim.run()
    c = sim.engine.counters
    return {"reuse %": 100 * c.num_reused_tokens / c.num_prompt_tokens,
            "prefill tokens": c.num_prefill_tokens, "ram restores": c.restores["ram"],
            "ttft mean": statistics.mean(sim.ttfts()), "wall s": makespan}


def mixed(strategy: str) -> dict[str, float]:
    rng = random.Random(4)
    sim = Sim(n_parallel=8, batch_strategy=strategy, chunk_size=512, n_batch=2048)
    short = list(range(4))
    for i in short:
        sim.at(0.05 * i, lambda i=i: sim.submit(i, rand_tokens(rng, 32), 128))
    for j in range(4):
        sim.at(0.3 + 0.05 * j, lambda j=j: sim.submit(f"long{j}", rand_tokens(rng, 2000), 16))
    sim.run()
    longs = [sim.traces[f"long{j}"].ttft for j in range(4)]
    gaps = sim.gaps(short)
    return {"short itl p50": pct(gaps, 0.5), "short itl p99": pct(gaps, 0.99),
            "short itl max": max(gaps), "long ttft mean": statistics.mean(longs)}


def agents(strategy: str, n_agents: int = 6, turns: int = 5) -> dict[str, float]:
    rng = random.Random(5)
    sim = Sim(n_parallel=4, batch_strategy=strategy, chunk_size=512, n_batch=2048,
              prompt_cache_ram_mb=256, tuning=EngineTuning(ram_min_tokens=32))
    system = rand_tokens(rng, 650)
    history = {a: system + rand_tokens(rng, 60) for a in range(n_agents)}
    later: list[float] = []

    def turn(agent: int, k: int) -> None:
        prompt = history[agent] + rand_tokens(rng, rng.randint(100, 200))

        def done(trace: Trace, agent: int = agent, k: int = k, prompt: list[int] = prompt
                 ) -> None:
            if k:
                later.append(trace.ttft)
            history[agent] = prompt + trace.token_ids
            if k + 1 < turns:
                sim.at(sim.clock.now() + rng.uniform(0.5, 2.0), lambda: turn(agent, k + 1))

        sim.submit((agent, k), prompt, 48, on_done=done, session=f"agent-{agent}")

    for agent in range(n_agents):
        sim.at(rng.uniform(0, 0.5), lambda agent=agent: turn(agent, 0))
    makespan = sim.run()
    return {"ttft mean": statistics.mean(sim.ttfts()), "ttft p50 turns>=2": pct(later, 0.5),
            "ttft p90 turns>=2": pct(later, 0.9), "ttft max": max(sim.ttfts()),
            "wall s": makespan}


# --- report ------------------------------------------------------------------------------------


def table(title: str, rows: dict[str, dict[str, float]]) -> str:
    cols = list(next(iter(rows.values())))
    lines = [f"**{title}**", "", "| run | " + " | ".join(cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for name, row in rows.items():
        cells = [f"{v:.0f}" if isinstance(v, int) or abs(v) >= 100 else f"{v:.3f}"
                 for v in row.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report() -> str:
    parts = [
        table("1. Uniform load: 32 requests (Poisson 12/s), 128-token prompts, 64 out, "
              "n_parallel=4 (times in s)", {s: uniform(s) for s in STRATEGIES}),
        table("2. Wave of 8 requests sharing a 494-token prefix (+16 unique, 64 out), "
              "n_parallel=8", {"no dedup (llama-server behaviour)": wave(False),
                               "in-flight dedup": wave(True)}),
        table("3. 8 interleaved conversations x 6 turns on 4 slots (split KV, 2 KiB/token "
              "state)", {"RAM cache off": conversations(0), "RAM cache 64 MB": conversations(64)}),
        table("4. Mixed: 4 streams (32-token prompts, 128 out) + a burst of 4 prompts of 2000 "
              "tokens (16 out), n_parallel=8, n_batch=2048, chunk 512 (times in s)",
              {s: mixed(s) for s in STRATEGIES}),
        table("5. Agent loops: 6 agents x 5 turns on 4 slots, shared 650-token system prompt, "
              "+100-200 tokens a turn after a 0.5-2 s gap, 48 out, RAM cache (times in s)",
              {s: agents(s) for s in STRATEGIES}),
    ]
    return "\n\n".join(parts)


def write_results(body: str, path: Path) -> None:
    heading = "## Simulation (fake backend)"
    intro = (f"{heading}\n\n`python bench/sim_engine.py --write`. Simulated time on the fake "
             "backend's cost model (per decode: 6 ms + 0.8 ms per batch token + 2 us per KV cell "
             "read by an output row; restore 1 ns/byte), so the figures are deterministic and "
             "compare scheduling policies, not hardware.\n\n")
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    section = intro + body + "\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else \
        text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args(argv)
    body = report()
    print(body)
    if args.write:
        write_results(body, Path(__file__).with_name("RESULTS.md"))


if __name__ == "__main__":
    main(sys.argv[1:])
