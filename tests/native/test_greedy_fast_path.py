"""Greedy (after a logit bias) is picked from the logits row; anything more runs the chain.

Every pick is checked against the native chain llama.cpp runs for the same settings."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pytest

from llamapy._native import Batch, Context, Model, SamplerChain
from llamapy.engine.options import SamplingParams
from llamapy.errors import NoCandidateError
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


#: A bias that lifts any logit ``x`` with ``|x| < 2**15`` to exactly ``2**40`` in float32
#: (the float32 neighbours of 2**40 are 2**16 below and 2**17 above it): a tie that holds
#: whatever the logits are.
LIFT = 2.0**40


def exact_tie(row: np.ndarray, target: int, ids: Iterable[int]) -> tuple[int, float]:
    """The first token of ``ids`` that a float32 bias lifts to exactly ``row[target]`` (as C
    adds it: ``logit + bias`` in float32, rounded to nearest), and that bias.

    The row comes from this CPU's kernels, so no one token can be counted on: from a logit far
    under the target, or below zero, the sums' rounding step can be coarser than the target's
    and no bias lands on it. Each candidate is checked in numpy's float32 arithmetic (the same
    IEEE addition C does) with ``b = fl(y - x)`` and its nearest neighbours; every logit in
    ``[y/2, y]`` ties exactly (Sterbenz's lemma: ``y - x`` is a float32), as do most others
    (two in three on the default model's row), so the search ends within a few tokens on any CPU.
    """
    y = np.float32(row[target])
    for token in ids:
        x = np.float32(row[token])
        b = y - x
        for bias in (b, np.nextafter(b, np.float32(np.inf)), np.nextafter(b, np.float32(-np.inf))):
            if x + bias == y:
                return token, float(bias)
    raise AssertionError(f"no token of the range ties exactly with token {target}")


def decoded_row(model: Model, backend: LlamaBackend) -> int:
    """The logits row of a short prompt, decoded on ``backend``'s context."""
    batch = Batch(64)
    row = batch.add(0, 0, model.tokenize("The capital of France is"))
    backend.ctx.decode(batch)
    return row


def test_biased_picks_match_the_native_chain(model: Model, backend: LlamaBackend) -> None:
    ctx, row = backend.ctx, decoded_row(model, backend)
    logits = ctx.logits(row)
    top = int(logits.argmax())
    second = int(np.argsort(logits)[-2])
    # Ties with an unbiased logit (the top, or the new top once the top is banned), built from
    # this row: tokens below and above the tied one, nearest first.
    low, to_top_low = exact_tie(logits, top, range(top - 1, -1, -1))
    high, to_top_high = exact_tie(logits, top, range(top + 1, model.n_vocab))
    under, to_second = exact_tie(logits, second, (t for t in range(second - 1, -1, -1)
                                                  if t != top))
    # Ties between biased logits, by values that do not depend on the row.
    lifted = logits[[top, low, high]] + np.float32(LIFT)
    assert (lifted == np.float32(LIFT)).all(), "a logit of 2**15 or more"
    cases = {
        "ban the top": {top: float("-inf")},
        "lift another": {second: 3.0},
        "tie, lower id wins": {low: to_top_low},
        "tie, higher id loses": {high: to_top_high},
        "ban the top, tie the new top": {top: float("-inf"), under: to_second},
        "two lifted to one value": {high: LIFT, low: LIFT},
        "the top and a lower id lifted to one value": {top: LIFT, low: LIFT},
        "the top and a higher id lifted to one value": {top: LIFT, high: LIFT},
        "outside the vocabulary": {model.n_vocab + 5: 100.0, -3: 100.0},
        "huge bias": {second: 1e300},
    }
    picks = {}
    for name, bias in cases.items():
        fast = GreedyPick(bias, model.n_vocab)(ctx.logits(row))
        assert fast == native_pick(model, ctx, row, bias), name
        picks[name] = fast
    assert picks["ban the top"] == second and picks["lift another"] == second
    assert picks["tie, lower id wins"] == low and picks["tie, higher id loses"] == top
    assert picks["ban the top, tie the new top"] == under
    assert picks["two lifted to one value"] == low
    assert picks["the top and a lower id lifted to one value"] == low
    assert picks["the top and a higher id lifted to one value"] == top
    assert picks["outside the vocabulary"] == top


def test_both_refuse_a_bias_that_bans_every_token(model: Model, backend: LlamaBackend) -> None:
    ctx, row = backend.ctx, decoded_row(model, backend)
    banned = {t: float("-inf") for t in range(model.n_vocab)}  # both refuse, typed
    with pytest.raises(NoCandidateError):
        GreedyPick(banned, model.n_vocab)(ctx.logits(row))
    with pytest.raises(NoCandidateError):
        native_pick(model, ctx, row, banned)


def test_greedy_with_anything_more_runs_the_chain(backend: LlamaBackend) -> None:
    for params in (SamplingParams(temp=0.0, penalty_repeat=1.3),
                   SamplingParams(temp=0.0, grammar='root ::= "yes" | "no"'),
                   SamplingParams(temp=0.7, seed=1)):
        sampler = backend.new_sampler(params)
        assert sampler._pick is None
        sampler.close()
