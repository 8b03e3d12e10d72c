"""Speculative decoding on the fake backend under a tight batch budget and KV pressure, and
after faults: drafts shrink or are dropped first, and what is generated never changes."""

from __future__ import annotations

import itertools

import pytest
from spec_helpers import (
    ENDLESS,
    PROMPTS,
    Job,
    OracleDrafter,
    assert_reference,
    checked_drain,
    draft_lens,
    job,
    reference_of,
    run_jobs,
    spec_engine,
    submit_jobs,
)

from llamapy.engine import (
    BatchPlan,
    Engine,
    ErrorEvent,
    FakeBackend,
)
from llamapy.errors import ContextOverflowError

# --- the batch budget and KV pressure ------------------------------------------------------


def four_decoding(**config) -> tuple[OracleDrafter, list[Job], FakeBackend, Engine]:
    drafter = OracleDrafter(ENDLESS)
    engine, backend = spec_engine(drafter=drafter, model=ENDLESS, n_parallel=4,
                                  spec_type="draft", spec_adaptive=False, **config)
    jobs = [job(i, [10 + i, 20 + i, 30 + i, 40 + i], max_tokens=20, seed=i) for i in range(4)]
    run_jobs(engine, backend, jobs)
    assert_reference(backend, jobs)
    return drafter, jobs, backend, engine


def test_drafts_shrink_to_fit_n_batch():
    _, _, backend, engine = four_decoding(n_batch=8, spec_draft_n_max=8)
    assert all(plan.n_tokens <= 8 for plan in backend.plans)
    full = [p for p in backend.plans if len(p.segments) == 4 and p.n_tokens == 8]
    assert full, "four decoding slots never filled the batch with drafts"
    assert any(0 < n < 8 for n in draft_lens(backend.plans)), "no draft was shortened"
    assert engine.counters.num_draft_accepted > 0


def test_a_draft_cut_by_n_batch_below_n_min_is_not_verified():
    _, _, backend, _ = four_decoding(n_batch=8, spec_draft_n_max=3, spec_draft_n_min=3)
    lens = draft_lens(backend.plans)
    assert 3 in lens
    assert all(n == 0 or n >= 3 for n in lens), f"drafts shorter than n_min: {sorted(lens)}"
    assert all(plan.n_tokens <= 8 for plan in backend.plans)


class AttemptLog(FakeBackend):
    """Records every decode attempt and whether it succeeded."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.attempts: list[tuple[BatchPlan, bool]] = []

    def decode(self, plan: BatchPlan) -> None:
        try:
            super().decode(plan)
        except Exception:
            self.attempts.append((plan, False))
            raise
        self.attempts.append((plan, True))


def without_drafts(plan: BatchPlan) -> list[tuple[int, int, tuple[int, ...]]]:
    return [(s.seq_id, s.start_pos, tuple(s.token_ids[:len(s.token_ids) - s.n_outputs + 1]))
            for s in plan.segments]


def assert_drafts_dropped_first(backend: AttemptLog) -> None:
    """After a KV-full attempt with drafts, the next attempt is that batch again (after a
    purge) or without its drafts, never a split; and there was such an attempt."""
    attempts, seen = backend.attempts, 0
    for (plan, ok), (after, _) in itertools.pairwise(attempts):
        if not ok and any(d > 0 for d in draft_lens([plan])):
            seen += 1
            assert without_drafts(after) == without_drafts(plan), "split before dropping"
            assert after.segments == plan.segments or not any(draft_lens([after]))
    assert seen, "no decode with drafts ran out of KV"


def test_kv_pressure_drops_drafts_and_everyone_finishes():
    drafter = OracleDrafter(ENDLESS)
    engine, backend = spec_engine(drafter=drafter, model=ENDLESS, n_ctx=36, n_parallel=2,
                                  backend_cls=AttemptLog, spec_type="draft",
                                  spec_adaptive=False, cache_prompt=False)
    jobs = [job("short", [*range(1, 11)], max_tokens=4),
            job("long", [*range(11, 21)], max_tokens=20)]
    run_jobs(engine, backend, jobs)
    assert_reference(backend, jobs)
    c = engine.counters
    assert c.num_kv_pressure_events > 0
    assert c.num_batch_splits == 0 and c.num_context_overflows == 0
    assert c.num_draft_accepted > 0
    assert isinstance(backend, AttemptLog)
    assert_drafts_dropped_first(backend)


def test_kv_overflow_drops_drafts_before_splitting():
    drafter = OracleDrafter(ENDLESS)
    engine, backend = spec_engine(drafter=drafter, model=ENDLESS, n_ctx=40, n_parallel=2,
                                  backend_cls=AttemptLog, spec_type="draft",
                                  spec_adaptive=False, cache_prompt=False)
    jobs = [job(i, [*range(1 + 10 * i, 11 + 10 * i)], max_tokens=14, seed=i) for i in range(2)]
    submit_jobs(engine, jobs)
    checked_drain(engine, backend)
    c = engine.counters
    assert c.num_kv_pressure_events > 0 and c.num_batch_splits > 0
    assert isinstance(backend, AttemptLog)
    assert_drafts_dropped_first(backend)
    for j in jobs:
        ref = reference_of(backend, j)
        if isinstance(j.sink.final, ErrorEvent):
            assert isinstance(j.sink.final.exc, ContextOverflowError)
            assert j.sink.tokens == ref[:len(j.sink.tokens)]
        else:
            assert j.sink.tokens == ref
    assert any(j.sink.finish_reason == "max_tokens" for j in jobs)



# --- faults, reuse after a verification, exact fits ----------------------------------------


@pytest.mark.parametrize("kind", ["decode_error", "abort", "invalid_batch"])
def test_a_failed_verification_decode_leaves_no_draft_kv(kind):
    engine, backend = spec_engine(drafter=OracleDrafter(ENDLESS), model=ENDLESS,
                                  backend_cls=AttemptLog, spec_type="draft", spec_adaptive=False)
    backend.inject(kind, at_call=2)  # the first decode after the prefill carries the drafts
    jobs = [job(i, PROMPTS[i], max_tokens=12, seed=i) for i in range(2)]
    run_jobs(engine, backend, jobs)  # check_all after every tick: KV == what the engine knows
    assert isinstance(backend, AttemptLog)
    failed, ok = backend.attempts[1]
    assert not ok and all(n > 0 for n in draft_lens([failed]))
    for j in jobs:
        assert isinstance(j.sink.final, ErrorEvent)
        assert j.sink.tokens == reference_of(backend, j)[:1]


def test_an_injected_kv_full_drops_the_drafts_and_retries():
    engine, backend = spec_engine(drafter=OracleDrafter(ENDLESS), model=ENDLESS,
                                  backend_cls=AttemptLog, spec_type="draft", spec_adaptive=False)
    backend.inject("kv_full", at_call=2)
    jobs = [job(i, PROMPTS[i], max_tokens=12, seed=i) for i in range(2)]
    run_jobs(engine, backend, jobs)
    assert_reference(backend, jobs)
    assert isinstance(backend, AttemptLog)
    (failed, _), (retried, ok) = backend.attempts[1:3]
    assert any(draft_lens([failed])) and not any(draft_lens([retried])) and ok
    assert engine.counters.num_kv_pressure_events == 1 and engine.counters.num_batch_splits == 0


def test_a_follow_up_request_reuses_the_kv_a_verification_left():
    engine, backend = spec_engine(drafter=OracleDrafter(ENDLESS, 0.3, seed=1), model=ENDLESS,
                                  n_parallel=1, spec_type="draft", spec_adaptive=False)
    first = job(1, PROMPTS[0], max_tokens=15, temp=0.8)
    run_jobs(engine, backend, [first])
    assert engine.counters.num_draft_tokens > engine.counters.num_draft_accepted > 0
    prompt = [*first.prompt, *first.sink.tokens, 7]
    (sink,) = run_jobs(engine, backend, [second := job(2, prompt, max_tokens=15, temp=0.8)])
    assert sink.tokens == reference_of(backend, second)
    assert sink.final.timings.reused_tokens == len(first.prompt) + 15 - 1


def test_per_sequence_kv_fits_exactly_with_drafts():
    engine, backend = spec_engine(drafter=OracleDrafter(ENDLESS), model=ENDLESS, n_ctx=64,
                                  n_parallel=2, unified=False, spec_type="draft",
                                  spec_adaptive=False)
    jobs = [job(i, [*range(1 + 20 * i, 21 + 20 * i)], max_tokens=12, seed=i) for i in range(2)]
    run_jobs(engine, backend, jobs)  # 20 + 12 == n_ctx_seq
    assert_reference(backend, jobs)
    c = engine.counters
    assert c.num_draft_accepted > 0 and c.num_kv_pressure_events == 0
