"""Greedy (after a logit bias) is picked from the logits row; anything more runs the chain.

Every pick is checked against the native chain llama.cpp runs for the same settings."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from llamapy._native import Batch, Context, Model, SamplerChain
from llamapy.engine.options import SamplingParams
from llamapy.greedy import GreedyPick
from llamapy.llama_backend import LlamaBackend, build_chain

PROMPTS = ("One, two,", "The sky is", "def main():", "Roses are red, violets")


@pytest.fixture()
def backend(model: Model) -> Iterator[LlamaBackend]:
    with Context(model, n_ctx=1024, n_batch=256, n_seq_max=4, kv_unified=True,
                 n_threads=2) as ctx:
        yield LlamaBackend(model, ctx)


def native_pick(model: Model, ctx: Context, row: int, bias: dict[int, float]) -> int:
    with build_chain(model, SamplingParams(temp=0.0, logit_bias=bias)) as chain:
        return chain.sample(ctx, row)


def test_greedy_streams_pick_what_llama_cpps_greedy_picks(model: Model,
                                                          backend: LlamaBackend) -> None:
    # Four sequences decode together for 24 steps; at every row the fast sampler and a native
    # greedy chain must pick the same token.
    ctx, batch = backend.ctx, Batch(256)
    eog = {t: float("-inf") for t in model.eog_tokens()}  # what ignore_eos adds
    fast = [backend.new_sampler(SamplingParams(temp=0.0, logit_bias=eog if i % 2 else {}))
            for i in range(len(PROMPTS))]
    assert all(s._pick is not None for s in fast)
    chains = [SamplerChain(model).add_greedy() for _ in PROMPTS]
    tokens = [model.tokenize(p) for p in PROMPTS]
    rows = [batch.add(i, 0, t) for i, t in enumerate(tokens)]
    picked: list[list[int]] = [[] for _ in PROMPTS]
    for _ in range(24):
        ctx.decode(batch)
        batch.clear()
        for i, row in enumerate(rows):
            tok = fast[i].sample(row)
            assert tok == (chains[i].sample(ctx, row) if i % 2 == 0
                           else native_pick(model, ctx, row, eog))
            picked[i].append(tok)
        rows = [batch.add(i, len(tokens[i]) + len(picked[i]) - 1, [picked[i][-1]])
                for i in range(len(PROMPTS))]
    assert len({tuple(p) for p in picked}) == len(PROMPTS)  # four different continuations
    for sampler in fast:
        sampler.close()
    for chain in chains:
        chain.close()


def exact_tie(row: np.ndarray, token: int, target: int) -> float:
    """A float32 bias that lifts ``token`` to exactly ``row[target]`` (as C adds it)."""
    b = np.float32(row[target]) - np.float32(row[token])
    for _ in range(64):
        total = np.float32(row[token]) + b
        if total == row[target]:
            return float(b)
        b = np.nextafter(b, np.float32(np.inf if total < row[target] else -np.inf))
    raise AssertionError("no exact tie found")


def test_biased_picks_match_the_native_chain(model: Model, backend: LlamaBackend) -> None:
    ctx, batch = backend.ctx, Batch(64)
    row = batch.add(0, 0, model.tokenize("The capital of France is"))
    ctx.decode(batch)
    logits = ctx.logits(row)
    top = int(logits.argmax())
    second = int(np.argsort(logits)[-2])
    low, high = min(top, second) - 1, max(top, second) + 1
    cases = {
        "ban the top": {top: float("-inf")},
        "lift another": {second: 3.0},
        "tie, lower id wins": {low: exact_tie(logits, low, top)},
        "tie, higher id loses": {high: exact_tie(logits, high, top)},
        "ban the top, tie the new top": {top: float("-inf"), low: exact_tie(logits, low, second)},
        "outside the vocabulary": {model.n_vocab + 5: 100.0, -3: 100.0},
        "every token banned": {t: float("-inf") for t in range(model.n_vocab)},
        "huge bias": {second: 1e300},
    }
    picks = {}
    for name, bias in cases.items():
        fast = GreedyPick(bias, model.n_vocab)(ctx.logits(row))
        assert fast == native_pick(model, ctx, row, bias), name
        picks[name] = fast
    assert picks["ban the top"] == second and picks["lift another"] == second
    assert picks["tie, lower id wins"] == low and picks["tie, higher id loses"] == top
    assert picks["outside the vocabulary"] == top


def test_greedy_with_anything_more_runs_the_chain(backend: LlamaBackend) -> None:
    for params in (SamplingParams(temp=0.0, penalty_repeat=1.3),
                   SamplingParams(temp=0.0, grammar='root ::= "yes" | "no"'),
                   SamplingParams(temp=0.7, seed=1)):
        sampler = backend.new_sampler(params)
        assert sampler._pick is None
        sampler.close()
