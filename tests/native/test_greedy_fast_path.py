"""Greedy alone is picked from the logits row directly; anything more goes through the chain."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamapy._native import Batch, Context, Model, SamplerChain
from llamapy.engine.options import SamplingParams
from llamapy.llama_backend import LlamaBackend

PROMPTS = ("One, two,", "The sky is", "def main():", "Roses are red, violets")


@pytest.fixture()
def backend(model: Model) -> Iterator[LlamaBackend]:
    with Context(model, n_ctx=1024, n_batch=256, n_seq_max=4, kv_unified=True,
                 n_threads=2) as ctx:
        yield LlamaBackend(model, ctx)


def test_the_fast_greedy_pick_is_llama_cpps_greedy_pick(model: Model,
                                                        backend: LlamaBackend) -> None:
    # Four sequences decode together for 24 steps; at every row the fast sampler and a native
    # greedy chain (the sampler llama.cpp would run) must pick the same token.
    ctx, batch = backend.ctx, Batch(256)
    fast = [backend.new_sampler(SamplingParams(temp=0.0)) for _ in PROMPTS]
    assert all(s._argmax for s in fast)
    native_chains = [SamplerChain(model).add_greedy() for _ in PROMPTS]
    tokens = [model.tokenize(p) for p in PROMPTS]
    rows = [batch.add(i, 0, t) for i, t in enumerate(tokens)]
    picked: list[list[int]] = [[] for _ in PROMPTS]
    for _ in range(24):
        ctx.decode(batch)
        batch.clear()
        for i, row in enumerate(rows):
            tok = fast[i].sample(row)
            assert tok == native_chains[i].sample(ctx, row)
            picked[i].append(tok)
        rows = [batch.add(i, len(tokens[i]) + len(picked[i]) - 1, [picked[i][-1]])
                for i in range(len(PROMPTS))]
    assert len({tuple(p) for p in picked}) == len(PROMPTS)  # four different continuations
    for s in fast:
        s.close()
    for c in native_chains:
        c.close()


def test_greedy_with_anything_else_goes_through_the_chain(model: Model,
                                                          backend: LlamaBackend) -> None:
    # A logit bias that bans the greedy token: the chain honours it, so the pick changes.
    ctx, batch = backend.ctx, Batch(64)
    row = batch.add(0, 0, model.tokenize("The capital of France is"))
    ctx.decode(batch)
    top = ctx.argmax(row)
    banned = backend.new_sampler(SamplingParams(temp=0.0, logit_bias={top: float("-inf")}))
    repeat = backend.new_sampler(SamplingParams(temp=0.0, penalty_repeat=1.3))
    try:
        assert not banned._argmax and not repeat._argmax
        assert banned.sample(row) != top
    finally:
        banned.close()
        repeat.close()
