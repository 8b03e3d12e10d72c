"""Speculation keeps a sampled request's distribution exactly (not only its tokens per seed).

A tiny stochastic model: after a history with hash ``h`` the next token is drawn from the
explicit categorical distribution ``DISTS[h % 4]`` over tokens 1..3, by inverse CDF on the
request's own seeded RNG stream (:class:`CategoricalSampler`). Every request has prompt
``[1, 2]`` and ``max_tokens=4``; a fixed drafter proposes ``[2, 3]`` (cut to fit) at every step,
right with probability about 0.1-0.25. The four emitted tokens (81 outcomes) of 12 000 seeds
are compared with the exact ``p`` by a chi-square test at a 0.1 % level (fixed seeds:
deterministic, never flaky).

The sanity checks feed the same statistic the outcomes of two broken verification rules run on
the same RNG streams: "accept a drafted token whenever ``p(draft) > 0``" and "accept it with
probability ``p(draft)``, else draw from the full ``p``" (which over-weights the draft); both
must be rejected.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import product

import pytest
from spec_helpers import job, spec_engine, submit_jobs

from llamapy.engine import FakeBackend, FakeModel, SamplingParams
from llamapy.engine.request import Run
from llamapy.engine.speculation.drafting import DraftJob
from llamapy.engine.testing import drain

VOCAB = (1, 2, 3)
DISTS = ((0.5, 0.3, 0.2), (0.2, 0.5, 0.3), (0.3, 0.2, 0.5), (0.25, 0.35, 0.4))
MODEL = FakeModel(n_vocab=4, eog_permille=0)  # token 0 (EOG) is never drawn
PROMPT = (1, 2)
MAX_TOKENS = 4
DRAFT = (2, 3)
N_SEEDS = 12_000
#: chi2.ppf(0.999, df=80): 81 outcomes of four tokens, no fitted parameter.
CHI2_CRITICAL = 124.84


def dist(history: Sequence[int]) -> tuple[float, ...]:
    """The exact next-token distribution (over ``VOCAB``) after ``history``."""
    return DISTS[MODEL.history_hash(history) % len(DISTS)]


def draw(p: Sequence[float], u: float) -> int:
    """Inverse CDF: the token of ``VOCAB`` that ``u`` in [0, 1) falls on."""
    acc = 0.0
    for token, q in zip(VOCAB, p, strict=True):
        acc += q
        if u < acc:
            return token
    return VOCAB[-1]


class CategoricalSampler:
    """Draws from ``DISTS`` by the history hash of the row, on its own seeded RNG stream."""

    def __init__(self, backend: FakeBackend, params: SamplingParams) -> None:
        self.backend = backend
        self.rng = random.Random(params.seed)

    def sample(self, batch_index: int) -> int:
        row = self.backend.output_row(batch_index)
        return draw(DISTS[row % len(DISTS)], self.rng.random())

    def accept(self, token_id: int) -> None:
        return None

    def top_logprobs(self, batch_index: int, n: int) -> list[tuple[int, float]]:
        return []

    def token_logprob(self, batch_index: int, token_id: int) -> float:
        return 0.0

    def close(self) -> None:
        self.backend.open_samplers.discard(self)  # type: ignore[arg-type]


class CategoricalBackend(FakeBackend):
    """The fake backend with :class:`CategoricalSampler` s."""

    def new_sampler(self, params: SamplingParams) -> CategoricalSampler:  # type: ignore[override]
        sampler = CategoricalSampler(self, params)
        self.open_samplers.add(sampler)  # type: ignore[arg-type]
        return sampler


class FixedDrafter:
    """Proposes ``DRAFT`` (cut to ``n_max``) whatever the history."""

    name = "draft"

    def propose(self, jobs: Sequence[DraftJob]) -> None:
        for j in jobs:
            j.tokens, j.source = list(DRAFT[:j.n_max]), j.run.key

    def finished(self, run: Run) -> None:
        return None

    def close(self) -> None:
        return None


def engine_outcomes(seeds: range, speculate: bool) -> dict[int, tuple[int, ...]]:
    """Each seed's emitted tokens through the engine (16 requests at a time)."""
    engine, backend = spec_engine(
        drafter=FixedDrafter() if speculate else None, model=MODEL, n_ctx=256, n_parallel=16,
        backend_cls=CategoricalBackend, spec_type="draft" if speculate else "off",
        spec_draft_n_max=len(DRAFT), spec_adaptive=False, cache_prompt=False, max_queue=0)
    out: dict[int, tuple[int, ...]] = {}
    for start in range(seeds.start, seeds.stop, 32):
        jobs = [job(s, PROMPT, max_tokens=MAX_TOKENS, temp=0.8, seed=s)
                for s in range(start, min(start + 32, seeds.stop))]
        submit_jobs(engine, jobs)
        drain(engine)
        out.update((j.request_id, tuple(j.sink.tokens)) for j in jobs)  # type: ignore[misc]
    assert not backend.violations and not backend.open_samplers
    assert (engine.counters.num_draft_tokens > 0) == speculate
    return out


# --- the verification rules, simulated on the same RNG streams -----------------------------

#: (history, draft, rng) -> the tokens one verification step emits.
Rule = Callable[[list[int], Sequence[int], random.Random], list[int]]


def correct_rule(history: list[int], draft: Sequence[int], rng: random.Random) -> list[int]:
    """The engine's rule: draw row by row, go on while the drawn token is the drafted one."""
    out: list[int] = []
    for i in range(len(draft) + 1):
        token = draw(dist(history + out), rng.random())
        out.append(token)
        if i == len(draft) or token != draft[i]:
            break
    return out


def accept_if_possible(history: list[int], draft: Sequence[int],
                       rng: random.Random) -> list[int]:
    """Broken: a drafted token the model can produce at all is taken without a draw."""
    out: list[int] = []
    for d in draft:
        if dist(history + out)[VOCAB.index(d)] == 0:
            return [*out, draw(dist(history + out), rng.random())]
        out.append(d)
    return [*out, draw(dist(history + out), rng.random())]


def accept_then_full_resample(history: list[int], draft: Sequence[int],
                              rng: random.Random) -> list[int]:
    """Broken: accept ``d`` with probability ``p(d)``, else draw from the full ``p`` (which
    may draw ``d`` again: ``P(d) = 2p - p^2``)."""
    out: list[int] = []
    for d in draft:
        p = dist(history + out)
        if rng.random() < p[VOCAB.index(d)]:
            out.append(d)
            continue
        return [*out, draw(p, rng.random())]
    return [*out, draw(dist(history + out), rng.random())]


def simulate(seed: int, rule: Rule | None) -> tuple[int, ...]:
    """One request's tokens: the first from the prompt's row, then verification steps with
    ``DRAFT`` cut as the engine cuts it (``rule=None``: no speculation, one draw a step)."""
    rng, out = random.Random(seed), list[int]()
    while len(out) < MAX_TOKENS:
        history = [*PROMPT, *out]
        n = min(len(DRAFT), MAX_TOKENS - len(out) - 1)
        if not out or rule is None or n < 1:
            out.append(draw(dist(history), rng.random()))
        else:
            out += rule(history, DRAFT[:n], rng)
    return tuple(out)


# --- the statistic ---------------------------------------------------------------------------


def exact_p(tokens: Sequence[int]) -> float:
    """The exact probability of emitting ``tokens`` after ``PROMPT``."""
    prob = 1.0
    for i, token in enumerate(tokens):
        prob *= dist([*PROMPT, *tokens[:i]])[VOCAB.index(token)]
    return prob


def chi_square(outcomes: Sequence[tuple[int, ...]]) -> float:
    """Pearson's statistic of ``outcomes`` against the exact distribution."""
    counts, n = Counter(outcomes), len(outcomes)
    stat = 0.0
    for cell in product(VOCAB, repeat=MAX_TOKENS):
        expected = n * exact_p(cell)
        stat += (counts.get(cell, 0) - expected) ** 2 / expected
    return stat


def test_exact_p_is_a_distribution():
    assert sum(exact_p(c) for c in product(VOCAB, repeat=MAX_TOKENS)) == pytest.approx(1.0)
    assert min(exact_p(c) for c in product(VOCAB, repeat=MAX_TOKENS)) * N_SEEDS > 10


def test_speculation_keeps_the_sampled_distribution():
    spec = engine_outcomes(range(N_SEEDS), speculate=True)
    seeds = range(N_SEEDS)
    # Per seed, the same tokens as sampling without speculation (simulated, and the engine's).
    assert all(spec[s] == simulate(s, None) == simulate(s, correct_rule) for s in seeds)
    plain = engine_outcomes(range(400), speculate=False)
    assert all(plain[s] == spec[s] for s in plain)
    # And the distribution is the exact p.
    stat = chi_square([spec[s] for s in seeds])
    assert stat < CHI2_CRITICAL, f"chi-square {stat:.1f} rejects the speculative distribution"
    # The fixed draft was sometimes right and sometimes wrong.
    hits = sum(spec[s][1:3] == DRAFT for s in seeds)
    assert 0.05 * N_SEEDS < hits < 0.5 * N_SEEDS


def test_the_statistic_rejects_broken_rules():
    for rule in (accept_if_possible, accept_then_full_resample):
        stat = chi_square([simulate(s, rule) for s in range(N_SEEDS)])
        assert stat > CHI2_CRITICAL, f"{rule.__name__}: chi-square {stat:.1f} accepts it"
