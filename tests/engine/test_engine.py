"""Engine behaviour: submission errors, queue bound, cancellation, finish reasons, failures."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, ref, submit

from llamapy.engine import (
    DoneEvent,
    ErrorEvent,
    ProgressEvent,
    Request,
    RequestOptions,
    TokenEvent,
)
from llamapy.engine.testing import Recorder, drain
from llamapy.errors import (
    ClosedError,
    ContextOverflowError,
    DecodeAbortedError,
    DecodeError,
    GrammarError,
    InvalidOptionError,
    QueueFullError,
)

P = list(range(1, 21))


def busy_engine(max_queue: int, n_parallel: int = 1):
    engine, backend = make_engine(n_parallel=n_parallel, max_queue=max_queue)
    for i in range(n_parallel):
        submit(engine, f"run{i}", P, max_tokens=50, temp=0.0)
    return engine, backend


def snapshot(engine):
    return (len(engine.queue), sorted(map(str, engine.runs)), engine.counters.num_submitted)


# --- submission ------------------------------------------------------------------------------


def test_queue_full_exactly_at_max_queue_and_changes_nothing():
    engine, backend = busy_engine(max_queue=2)
    submit(engine, "q1", P, max_tokens=1)
    submit(engine, "q2", P, max_tokens=1)
    before, samplers = snapshot(engine), len(backend.open_samplers)
    with pytest.raises(QueueFullError) as info:
        submit(engine, "q3", P, max_tokens=1)
    assert info.value.max_queue == 2 and info.value.http_status == 429
    assert snapshot(engine) == before and len(backend.open_samplers) == samplers
    engine.cancel("q1")
    submit(engine, "q3", P, max_tokens=1)


def test_max_queue_zero_is_unlimited():
    engine, _ = busy_engine(max_queue=0)
    for i in range(100):
        submit(engine, i, P, max_tokens=1)
    assert len(engine.queue) == 100


def test_free_slot_takes_a_request_even_with_a_tiny_queue():
    engine, _ = make_engine(n_parallel=3, max_queue=1)
    for i in range(4):
        submit(engine, i, P, max_tokens=1)
    assert len(engine.queue) == 1


def test_prompt_plus_max_tokens_over_the_sequence_context_is_rejected_up_front():
    engine, _ = make_engine(n_parallel=2, n_ctx=64, unified=False)  # 32 per sequence
    with pytest.raises(ContextOverflowError) as info:
        submit(engine, 1, P, max_tokens=13)
    err = info.value
    assert (err.stage, err.resident_tokens, err.additional_tokens, err.n_ctx) == \
        ("admit", 0, 33, 32)
    assert not engine.runs
    submit(engine, 1, P, max_tokens=12)


@pytest.mark.parametrize(("prompt", "options"), [
    ([], {"max_tokens": 3}), ([1, 99999], {}), ([1, -1], {}), ([1, 2.0], {}),
])
def test_bad_prompts_are_rejected(prompt, options):
    engine, _ = make_engine()
    with pytest.raises(InvalidOptionError):
        submit(engine, 1, prompt, **options)
    assert not engine.runs


def test_duplicate_active_request_id_is_rejected():
    engine, _ = make_engine()
    submit(engine, "x", P, max_tokens=5)
    with pytest.raises(InvalidOptionError, match="already active"):
        submit(engine, "x", P, max_tokens=5)


def test_bad_grammar_rejects_only_that_request():
    engine, backend = make_engine()
    ok = submit(engine, "ok", P, max_tokens=3)
    with pytest.raises(GrammarError):
        submit(engine, "bad", P, max_tokens=3, grammar="nonsense")
    assert set(engine.runs) == {"ok"}
    drain(engine)
    assert ok.finish_reason in ("eog", "max_tokens") and not backend.open_samplers


# --- finishing -------------------------------------------------------------------------------


def first_seed_with(backend, prompt, n, pred) -> int:
    return next(s for s in range(500) if pred(ref(backend, prompt, n, seed=s)))


def test_finish_reasons_eog_and_max_tokens():
    engine, backend = make_engine()
    eog = backend.model.eog_token
    s_eog = first_seed_with(backend, P, 10, lambda t: t[-1] == eog)
    s_max = first_seed_with(backend, P, 10, lambda t: eog not in t)
    a = submit(engine, "a", P, max_tokens=10, seed=s_eog)
    b = submit(engine, "b", P, max_tokens=10, seed=s_max)
    drain(engine)
    assert (a.finish_reason, b.finish_reason) == ("eog", "max_tokens")
    assert a.final.completion_tokens == len(a.tokens) and b.final.completion_tokens == 10
    assert a.tokens == ref(backend, P, 10, seed=s_eog)
    assert a.events[-2].text == "" or not backend.token_to_piece(a.tokens[-1])


def test_stop_string_spanning_tokens_ends_generation_without_leaking():
    engine, backend = make_engine()

    def word(t: int) -> bool:
        return backend.token_to_piece(t).startswith(b" w")

    seed = first_seed_with(backend, P, 8, lambda t: len(t) > 3 and all(map(word, t[:3])))
    tokens = ref(backend, P, 8, seed=seed)
    first, second = (backend.token_to_piece(t).decode() for t in tokens[1:3])
    stop = first[2:] + second[:3]  # "<n1> w<n2 prefix>": spans tokens 2 and 3
    sink = submit(engine, 1, P, max_tokens=8, seed=seed, stop=("zzz", stop))
    drain(engine)
    assert sink.finish_reason == "stop" and sink.final.stop_word == stop
    assert sink.tokens == tokens[:3]
    expected = backend.token_to_piece(tokens[0]).decode() + first[:2]
    assert sink.text == expected and stop not in sink.text


def test_numpy_token_ids_are_accepted():
    import numpy as np

    engine, backend = make_engine()
    sink = submit(engine, 1, np.array(P, dtype=np.int32), max_tokens=2)
    drain(engine)
    assert sink.tokens == ref(backend, P, 2)


def test_engine_config_must_match_the_backend():
    from llamapy.engine import Engine, EngineConfig, FakeBackend

    with pytest.raises(InvalidOptionError):
        Engine(FakeBackend(n_seq_max=2), EngineConfig(n_parallel=3))
    with pytest.raises(InvalidOptionError):
        Engine(FakeBackend(kv_unified=False), EngineConfig(kv_unified=True))
    assert Engine(FakeBackend(n_batch=64), EngineConfig(n_batch=2048)).n_batch == 64


def test_prefill_only_request_computes_kv_and_samples_nothing():
    engine, backend = make_engine(n_parallel=1)
    sink = submit(engine, 1, P, max_tokens=0)
    drain(engine)
    assert sink.finish_reason == "prefill" and sink.tokens == []
    assert engine.pool.slots[0].cached == P and backend.seq_pos_max(0) == len(P) - 1


def test_exactly_one_final_event_and_tokens_before_it():
    engine, _ = make_engine()
    sink = submit(engine, 1, P, max_tokens=6)
    drain(engine)
    finals = [e for e in sink.events if isinstance(e, DoneEvent | ErrorEvent)]
    assert len(finals) == 1 and sink.events[-1] is finals[0]
    assert all(isinstance(e, TokenEvent) for e in sink.events[:-1])


def test_progress_events_before_and_after_each_prompt_chunk():
    engine, backend = make_engine(n_parallel=1, chunk_size=8)
    submit(engine, 0, P[:12], max_tokens=1)  # a cached prefix of 12 tokens
    drain(engine)
    sink = submit(engine, 1, P + P, max_tokens=3, return_progress=True, timings_per_token=True)
    drain(engine)
    progress = [e for e in sink.events if isinstance(e, ProgressEvent)]
    assert [(e.total, e.cache, e.processed) for e in progress] == [
        (40, 12, 12), (40, 12, 20), (40, 12, 28), (40, 12, 36), (40, 12, 40)]
    assert progress[0].timings.prefill_s == 0.0
    first_token = sink.events.index(next(e for e in sink.events if isinstance(e, TokenEvent)))
    assert all(isinstance(e, ProgressEvent) for e in sink.events[:first_token])
    tokens = [e for e in sink.events if isinstance(e, TokenEvent)]
    assert [e.timings.completion_tokens for e in tokens if e.timings] == list(
        range(1, len(tokens) + 1))
    assert sink.tokens == ref(backend, P + P, 3)  # progress changes nothing generated
    plain = submit(engine, 2, P[::-1], max_tokens=2)
    drain(engine)
    assert not any(isinstance(e, ProgressEvent) for e in plain.events)
    assert all(e.timings is None for e in plain.events if isinstance(e, TokenEvent))


def test_logprobs_when_n_probs():
    engine, _ = make_engine()
    sink = submit(engine, 1, P, max_tokens=3, n_probs=4)
    drain(engine)
    for event in sink.events[:-1]:
        top = event.logprobs
        assert all(isinstance(t, int) for t, _ in top)
        # the top 4, plus the sampled token's own pair when it is not among them
        assert event.token_id in [t for t, _ in top]
        assert len(top) == (4 if event.token_id in [t for t, _ in top[:4]] else 5)


# --- cancellation ----------------------------------------------------------------------------


def test_cancel_queued_request():
    engine, _ = busy_engine(max_queue=4)
    q = submit(engine, "q", P, max_tokens=5)
    assert engine.cancel("q") and q.finish_reason == "cancelled" and not engine.queue
    assert not engine.cancel("q") and not engine.cancel("never")


def test_cancel_running_request_frees_the_slot_at_once_keeping_its_prefix():
    engine, backend = make_engine(n_parallel=1)
    sink = submit(engine, 1, P, max_tokens=50, temp=0.0)
    for _ in range(3):
        engine.tick()
    assert engine.cancel(1)
    assert sink.finish_reason == "cancelled" and engine.pool.slots[0].is_idle
    assert engine.pool.slots[0].cached[: len(P)] == P and not backend.open_samplers
    again = submit(engine, 2, P, max_tokens=2, temp=0.0)
    drain(engine)
    assert again.final.timings.reused_tokens == len(P) - 1


def test_cancel_with_cache_prompt_false_drops_the_kv():
    engine, backend = make_engine(n_parallel=1)
    submit(engine, 1, P, max_tokens=50, cache_prompt=False)
    engine.tick()
    engine.cancel(1)
    assert engine.pool.slots[0].cached == [] and backend.seq_pos_max(0) == -1


@pytest.mark.parametrize("how", ["return_false", "raise"])
def test_consumer_going_away_cancels(how):
    engine, _ = make_engine(n_parallel=1)
    calls = []

    def sink(event):
        calls.append(event)
        if how == "raise" and isinstance(event, TokenEvent):
            raise RuntimeError("consumer crashed")
        return False

    engine.submit(Request(1, P, RequestOptions(max_tokens=50), sink))
    drain(engine)
    assert len(calls) == 2 and calls[-1].finish_reason == "cancelled"


# --- failures --------------------------------------------------------------------------------


def test_kv_pressure_purges_idle_caches_before_failing_anyone():
    engine, backend = make_engine(n_parallel=2, n_ctx=48)
    submit(engine, "old", P, max_tokens=1)
    drain(engine)
    assert sum(len(s.cached) for s in engine.pool.slots) == 20
    new = list(range(30, 50))
    seed = first_seed_with(backend, new, 20, lambda t: backend.model.eog_token not in t)
    sink = submit(engine, "new", new, max_tokens=20, seed=seed)
    drain(engine)
    assert sink.finish_reason in ("eog", "max_tokens")
    assert engine.counters.num_purged_slots == 1 and engine.counters.num_kv_pressure_events >= 1


def test_kv_pressure_splits_and_fails_only_the_request_that_cannot_fit():
    # (decode_maximal: both prefills in the first batch, which cannot fit the cells)
    engine, backend = make_engine(n_parallel=2, n_ctx=40, chunk_size=64, n_batch=64,
                                  batch_strategy="decode_maximal")
    eog = backend.model.eog_token
    seed = first_seed_with(backend, P, 19, lambda t: eog not in t)
    seed_b = first_seed_with(backend, list(range(30, 50)), 19, lambda t: eog not in t)
    a = submit(engine, "a", P, max_tokens=19, seed=seed)
    b = submit(engine, "b", list(range(30, 50)), max_tokens=19, seed=seed_b)
    drain(engine, each=engine.check_integrity)
    results = {a.finish_reason, b.finish_reason}
    assert results == {"max_tokens", "error"}
    failed = a if a.finish_reason == "error" else b
    err = failed.final.exc
    assert isinstance(err, ContextOverflowError) and err.stage == "decode"
    assert err.resident_tokens + err.additional_tokens > 40 - 20 and err.n_ctx == 40
    ok, prompt, ok_seed = (b, list(range(30, 50)), seed_b) if failed is a else (a, P, seed)
    assert ok.tokens == ref(backend, prompt, 19, seed=ok_seed)
    assert engine.counters.num_batch_splits >= 1


@pytest.mark.parametrize(("kind", "error"), [("decode_error", DecodeError),
                                             ("abort", DecodeAbortedError)])
def test_decode_failure_fails_the_batch_and_the_engine_carries_on(kind, error):
    engine, backend = make_engine(n_parallel=2)
    a = submit(engine, "a", P, max_tokens=5)
    engine.tick()
    backend.inject(kind)
    engine.tick()
    assert isinstance(a.final, ErrorEvent) and isinstance(a.final.exc, error)
    engine.check_integrity()
    b = submit(engine, "b", P, max_tokens=3, seed=2)
    drain(engine)
    assert b.tokens == ref(backend, P, 3, seed=2)


def test_close_ends_everything_with_closed_error():
    engine, backend = busy_engine(max_queue=4)
    q = submit(engine, "q", P, max_tokens=5)
    engine.tick()
    engine.close()
    engine.close()
    assert isinstance(q.final.exc, ClosedError) and not engine.runs and not backend.open_samplers
    with pytest.raises(ClosedError):
        submit(engine, "late", P)
    with pytest.raises(ClosedError):
        engine.tick()


# --- stats -----------------------------------------------------------------------------------


def test_stats_and_timings():
    clock = iter(range(10_000))
    engine, _ = make_engine(n_parallel=2)
    engine.clock = engine.executor.clock = engine.intake.clock = lambda: float(next(clock))
    sinks = [submit(engine, i, P, max_tokens=4, seed=i) for i in range(3)]
    stats = engine.stats()
    assert (stats.slots_prefilling, stats.queue_depth, stats.n_parallel) == (2, 1, 2)
    drain(engine)
    stats = engine.stats().as_dict()
    assert stats["num_submitted"] == 3 and stats["num_prompt_tokens"] == 60
    assert stats["num_generated_tokens"] == sum(len(s.tokens) for s in sinks)
    assert stats["slots_idle"] == 2 and stats["num_reused_tokens"] >= 19
    t = sinks[0].final.timings
    assert t.ttft_s > 0 and t.prompt_tokens == 20 and t.finish_reason == sinks[0].finish_reason
    assert sinks[2].final.timings.queued_s > 0
    assert set(t.as_dict()) >= {"queued_s", "ttft_s", "prefill_tok_per_s", "decode_tok_per_s",
                                "reused_tokens", "reuse_source"}


def test_a_prefilling_slot_reports_its_computed_tokens():
    engine, _ = make_engine(n_parallel=1, chunk_size=8, n_batch=8)
    submit(engine, "r", list(range(1, 31)), max_tokens=2)
    progress = []
    while engine.tick():
        slot = engine.stats().slots[0]
        if slot.state == "prefilling":
            progress.append(slot.num_computed_tokens)
    assert progress and progress == sorted(progress)  # grows chunk by chunk
    assert all(0 <= n < 30 for n in progress) and progress[-1] >= 8
    assert engine.stats().slots[0].num_computed_tokens == 0  # idle: no request


def test_has_work_and_idle_tick():
    engine, _ = make_engine()
    assert not engine.has_work and engine.tick() is False
    submit(engine, 1, P, max_tokens=1)
    assert engine.has_work and engine.tick() is True


def test_recorder_rejects_events_after_the_final_one():
    rec = Recorder()
    rec(DoneEvent(1, "eog", 0, 0, None))  # type: ignore[arg-type]
    with pytest.raises(AssertionError):
        rec(TokenEvent(1, 1, ""))


def test_sampler_failure_fails_only_that_request():
    engine, backend = make_engine(n_parallel=2)
    a = submit(engine, "a", P, max_tokens=4, seed=1)
    b = submit(engine, "b", [*P, 1], max_tokens=4, seed=2)
    engine.tick()
    backend.inject("sample_error")
    drain(engine, each=engine.check_integrity)
    failed = [s for s in (a, b) if s.finish_reason == "error"]
    assert len(failed) == 1 and isinstance(failed[0].final.exc, GrammarError)
    ok = b if failed[0] is a else a
    assert ok.finish_reason in ("eog", "max_tokens") and not backend.open_samplers
