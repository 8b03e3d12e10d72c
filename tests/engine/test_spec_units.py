"""Units of speculative decoding: the cost model (``DecodeCost``), the draft length rule
(``best_draft_len``), one request's adaptation (``Speculation``) and the options."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llamapy.engine import EngineConfig, RequestOptions, resolve_request_options
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.speculation.speculator import (
    MIN_STEPS_BEFORE_OFF,
    PRIOR_ACCEPTED,
    PRIOR_REJECTED,
    DecodeCost,
    Speculation,
    Speculator,
    best_draft_len,
)
from llamapy.engine.stats import Counters
from llamapy.errors import InvalidOptionError, UnknownOptionError
from llamapy.options.speculative import SpeculativeParams, speculative_overrides

# --- best_draft_len -----------------------------------------------------------------------


def payoff(acceptance: float, beta: float, k: int) -> float:
    return sum(acceptance ** i for i in range(k + 1)) / (1 + beta * k)


@given(acceptance=st.floats(0, 1), beta=st.floats(0, 1), n_max=st.integers(1, 12))
def test_best_draft_len_maximises_the_payoff(acceptance, beta, n_max):
    k, best = best_draft_len(acceptance, beta, n_max)
    assert 1 <= k <= n_max
    assert best == pytest.approx(payoff(acceptance, beta, k))
    assert all(payoff(acceptance, beta, j) <= best * (1 + 1e-9) for j in range(1, n_max + 1))


def test_free_batch_tokens_and_high_acceptance_draft_n_max():
    assert best_draft_len(0.9, 0.0, 8)[0] == 8
    assert best_draft_len(0.9, 0.01, 8)[0] == 8
    assert best_draft_len(1.0, 0.3, 5) == (5, pytest.approx(6 / 2.5))


def test_low_acceptance_on_a_cpu_does_not_pay():
    k, best = best_draft_len(0.1, 0.45, 8)
    assert k == 1 and best == pytest.approx(1.1 / 1.45) and best < 1
    assert best_draft_len(0.0, 0.3, 4) == (1, pytest.approx(1 / 1.3))


def test_n_max_below_one_still_means_one():
    assert best_draft_len(0.5, 0.1, 0)[0] == 1


# --- DecodeCost ----------------------------------------------------------------------------


SIZES = (1, 5, 3, 8, 2, 13, 1, 4)


def fed(a: float, b: float, sizes) -> DecodeCost:
    cost = DecodeCost(0.3)
    for n in sizes:
        cost.record(n, a + b * n)
    return cost


def test_decode_cost_recovers_the_marginal_token_cost():
    assert fed(0.010, 0.003, [1, 4, 9, 2, 16, 1]).beta == pytest.approx(3 / 13)
    assert fed(0.0, 0.004, SIZES).beta == pytest.approx(1.0)  # all cost per token
    assert fed(-0.001, 0.004, SIZES).beta == 1.0  # clamped to 1
    assert fed(1.0, 1e-6, SIZES).beta == 0.01  # a GPU: clamped to the floor


def test_a_draft_token_costs_more_when_streams_share_the_batch():
    cost = fed(0.009, 0.007, SIZES)
    assert cost.beta_for(1) == pytest.approx(cost.beta) == pytest.approx(7 / 16)
    assert cost.beta_for(4) == pytest.approx(0.028 / 0.037)  # vs the batch's cost per token
    assert cost.beta_for(0) == cost.beta_for(1)
    assert DecodeCost(0.3).beta_for(4) == 0.3  # the prior until it can fit


def test_decode_cost_keeps_its_prior_until_it_can_fit():
    assert fed(0.01, 0.003, [4] * 20).beta == 0.3  # one size only
    assert fed(0.01, 0.0, SIZES).beta == 0.3  # no measurable slope
    assert fed(0.05, -0.001, SIZES).beta == 0.3  # bigger batches faster: noise
    assert fed(-0.05, 0.001, SIZES).beta == 0.3  # a + b <= 0: nonsense


def test_decode_cost_ignores_prefill_batches_and_a_slow_first_decode():
    cost = fed(0.010, 0.003, [1, 1, 1, 4, 4, 4])
    cost.record(2, 0.6)  # the first decode of a new size: llama.cpp sizes its graph
    cost.record(2, 0.016)
    cost.record(2, 0.016)
    cost.record(512, 0.4)  # a prefill chunk runs at another rate: not fitted
    assert cost.beta == pytest.approx(3 / 13)


def test_decode_cost_follows_new_measurements():
    cost = fed(0.010, 0.010, [1, 8] * 8)
    assert cost.beta == pytest.approx(0.5)
    for n in [1, 8] * 8:
        cost.record(n, 0.010 + 0.001 * n)
    assert cost.beta == pytest.approx(1 / 11, rel=0.01)


# --- Speculation ---------------------------------------------------------------------------


def spec(adaptive: bool = True, n_max: int = 8, **kw) -> Speculation:
    return Speculation(SpeculativeParams(type="ngram", n_max=n_max, adaptive=adaptive, **kw))


def test_speculation_starts_at_n_max_with_the_prior_acceptance():
    s = spec()
    assert s.n_cur == 8 and s.active
    assert s.acceptance == pytest.approx(PRIOR_ACCEPTED / (PRIOR_ACCEPTED + PRIOR_REJECTED))


def test_rejections_switch_speculation_off_after_a_few_steps():
    s = spec()
    for step in range(1, 12):
        s.record(drafted=4, accepted=0)
        s.judge(beta=0.45)
        assert s.active == (step < MIN_STEPS_BEFORE_OFF), step
        if not s.active:
            break
    assert s.steps == MIN_STEPS_BEFORE_OFF and s.accepted == 0


def test_acceptance_keeps_speculation_on():
    s = spec()
    for _ in range(20):
        s.record(drafted=8, accepted=8)
        s.judge(beta=0.3)
    assert s.active and s.acceptance == pytest.approx(1.0, abs=1e-3)
    assert s.accepted_per_pos[0] == s.steps and len(s.accepted_per_pos) == 8


def test_without_adaptive_nothing_changes():
    s = spec(adaptive=False)
    for _ in range(10):
        s.record(drafted=8, accepted=0)
        s.judge(beta=1.0)
    assert s.active and s.n_cur == 8 and s.drafted == 80


def test_n_min_is_a_floor_for_a_draft_that_pays():
    owner = Speculator(FakeBackend(), Counters(), {}, SpeculativeParams(), 0.45)
    assert owner.draft_len("b", spec()) < 4  # the prior pays for a short draft only
    assert owner.draft_len("b", spec(n_min=4)) == 4


def test_a_bucket_that_does_not_pay_is_only_probed():
    book_owner = Speculator(FakeBackend(), Counters(), {}, SpeculativeParams(), 0.45)
    s = spec()
    assert book_owner.draft_len("weak", s) >= 1  # the prior pays
    for _ in range(6):
        book_owner.book.record("weak", 4, 0)
    lengths = []
    for _ in range(16):
        lengths.append(book_owner.draft_len("weak", s))
        book_owner.book.counts("weak")[2] += 1
    assert lengths.count(1) == 2 and lengths.count(0) == 14  # one probe every EXPLORE_EVERY
    assert book_owner.draft_len("strong", s) >= 1  # other buckets are unaffected


# --- options -------------------------------------------------------------------------------


def test_server_flags_resolve_to_speculative_params():
    config = EngineConfig(spec_type="ngram-mod,draft", spec_draft_n_max=4, spec_draft_n_min=2,
                          spec_ngram_size=3, spec_adaptive=False)
    assert config.speculative == SpeculativeParams(type=("ngram", "draft"), n_max=4, n_min=2,
                                                   ngram_size=3, adaptive=False)
    assert not EngineConfig().speculative.enabled


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("off", {"type": ()}), (False, {"type": ()}), (True, {"type": ("ngram",)}),
    ("ngram-simple", {"type": ("ngram",)}), (["draft", "ngram"], {"type": ("draft", "ngram")}),
    ({"n_max": 2}, {"n_max": 2}), ({"ngram_size": 2, "adaptive": False},
                                    {"ngram_size": 2, "adaptive": False}),
])
def test_request_overrides(value, expected):
    assert speculative_overrides(value) == expected
    merged = SpeculativeParams(type="ngram", n_max=8).merged(RequestOptions(
        speculative=value).speculative)
    for name, v in (expected or {}).items():
        assert getattr(merged, name) == v
    assert merged.n_max == (expected or {}).get("n_max", 8)


@pytest.mark.parametrize("value", [{"n_maxx": 2}, {"type": "ngram", "bogus": 1}])
def test_unknown_speculative_keys_raise(value):
    with pytest.raises(UnknownOptionError):
        RequestOptions(speculative=value)
    with pytest.raises(UnknownOptionError):
        resolve_request_options({"speculative": value})


@pytest.mark.parametrize("value", [
    {"n_max": -1}, {"n_max": 257}, {"n_max": "4"}, {"n_max": 2.5}, {"n_min": -1},
    {"type": "eagle"}, "eagle", 3, {"ngram_size": 1}, {"ngram_size": 65},
    {"adaptive": "yes"}, {"p_min": 2.0},
])
def test_bad_speculative_values_raise(value):
    with pytest.raises(InvalidOptionError) as info:
        RequestOptions(speculative=value)
    assert not isinstance(info.value, UnknownOptionError)


@pytest.mark.parametrize("flags", [{"spec_type": "eagle"}, {"spec_draft_n_max": -1},
                                   {"spec_ngram_size": 1}])
def test_bad_server_flags_raise(flags):
    with pytest.raises(InvalidOptionError):
        EngineConfig(**flags)
