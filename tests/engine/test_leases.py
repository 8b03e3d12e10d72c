"""Leases for workspace sessions: a leased slot is never routed, purged or evicted."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, ref, submit

from llamapy.engine.states import SlotState
from llamapy.engine.testing import drain
from llamapy.errors import ContextOverflowError, InvalidOptionError, UnknownLeaseError

PREFIX = list(range(1, 31))


def test_lease_takes_an_idle_slot_until_released():
    engine, _ = make_engine(n_parallel=2)
    a, b = engine.lease("s"), engine.lease("s")
    assert a is not None and b is not None and a != b
    assert engine.lease("s") is None
    assert engine.stats().slots_leased == 2
    engine.release(a)
    assert engine.stats().slots_leased == 1 and engine.stats().slots_idle == 1
    with pytest.raises(UnknownLeaseError):
        engine.release(a)


def test_leased_slot_is_never_routed_to_ordinary_requests():
    engine, _ = make_engine(n_parallel=1)
    lease = engine.lease()
    sink = submit(engine, "plain", PREFIX, max_tokens=2)
    assert not engine.has_work
    for _ in range(3):
        engine.tick()
    assert sink.final is None and len(engine.queue) == 1
    engine.release(lease)
    drain(engine)
    assert sink.finish_reason in ("eog", "max_tokens")


def test_prefill_only_on_a_lease_allows_full_reuse():
    engine, backend = make_engine(n_parallel=2)
    lease = engine.lease("s")
    first = submit(engine, 1, PREFIX, max_tokens=0, cache_scope="s", lease_id=lease)
    drain(engine)
    again = submit(engine, 2, PREFIX, max_tokens=0, cache_scope="s", lease_id=lease)
    drain(engine)
    assert first.finish_reason == again.finish_reason == "prefill"
    assert again.final.timings.reused_tokens == len(PREFIX)
    assert again.final.timings.prefill_tokens == 0
    assert engine.leases.tokens(lease) == PREFIX
    suffix = submit(engine, 3, [*PREFIX, 7, 8], max_tokens=0, cache_scope="s", lease_id=lease)
    drain(engine)
    assert suffix.final.timings.prefill_tokens == 2
    gen = submit(engine, 4, [*PREFIX, 7, 8], max_tokens=3, cache_scope="s", lease_id=lease)
    drain(engine)
    assert gen.final.timings.reused_tokens == len(PREFIX) + 1
    assert gen.tokens == ref(backend, [*PREFIX, 7, 8], 3)


def test_lease_requests_queue_behind_each_other():
    engine, _ = make_engine(n_parallel=2)
    lease = engine.lease()
    a = submit(engine, "a", PREFIX, max_tokens=4, lease_id=lease)
    b = submit(engine, "b", PREFIX, max_tokens=4, lease_id=lease)
    assert [r.request_id for r in engine.queue] == ["b"]
    drain(engine)
    assert a.final and b.final and engine.pool.leased_slot(lease).state is SlotState.LEASED


def test_leased_cache_survives_kv_pressure():
    engine, backend = make_engine(n_parallel=2, n_ctx=60)
    lease = engine.lease()
    submit(engine, "s", PREFIX, max_tokens=0, lease_id=lease)
    drain(engine)
    eog = backend.model.eog_token
    prompt = list(range(100, 120))
    seed = next(s for s in range(500) if eog not in ref(backend, prompt, 15, seed=s))
    plain = submit(engine, "p", prompt, max_tokens=15, seed=seed)
    drain(engine)
    assert engine.leases.tokens(lease) == PREFIX and backend.seq_pos_max(
        engine.pool.leased_slot(lease).seq_id) == len(PREFIX) - 1
    assert plain.finish_reason == "error"  # 30 leased + 20 + 15 > 60: the plain one fails
    assert engine.counters.num_purged_slots == 0


def test_snapshot_clear_restore_keep_the_slot_exact():
    engine, backend = make_engine(n_parallel=2)
    lease = engine.lease()
    submit(engine, 1, PREFIX, max_tokens=0, lease_id=lease)
    drain(engine)
    state = engine.leases.save(lease)
    assert state.token_ids == tuple(PREFIX)
    engine.leases.clear(lease)
    assert engine.leases.tokens(lease) == [] and backend.seq_pos_max(0) == -1
    engine.check_integrity()
    assert engine.leases.restore(lease, state, cache_identity="")
    assert engine.leases.tokens(lease) == PREFIX
    engine.check_integrity()
    sink = submit(engine, 2, [*PREFIX, 4], max_tokens=2, lease_id=lease)
    drain(engine)
    assert sink.final.timings.reused_tokens == len(PREFIX)
    assert sink.tokens == ref(backend, [*PREFIX, 4], 2)


def test_restore_that_does_not_match_leaves_the_slot_empty():
    engine, backend = make_engine(n_parallel=2)
    lease = engine.lease()
    submit(engine, 1, PREFIX, max_tokens=0, lease_id=lease)
    drain(engine)
    state = engine.leases.save(lease)
    lying = type(state)(state.state, state.token_ids[:3])  # bytes hold 30 positions
    assert not engine.leases.restore(lease, lying, cache_identity="x")
    assert engine.leases.tokens(lease) == [] and backend.seq_pos_max(0) == -1
    assert engine.pool.leased_slot(lease).key.cache_identity == "x"
    backend.inject("restore_fail")
    assert not engine.leases.restore(lease, state, cache_identity="")
    assert engine.leases.tokens(lease) == []
    engine.check_integrity()


def test_next_token_logits_recomputes_the_last_token_and_keeps_the_kv():
    engine, backend = make_engine(n_parallel=2)
    lease = engine.lease()
    submit(engine, 1, PREFIX, max_tokens=0, lease_id=lease)
    drain(engine)
    logits = engine.leases.next_token_logits(lease, PREFIX)
    greedy = ref(backend, PREFIX, 1, temp=0.0)[0]
    assert max(range(len(logits)), key=logits.__getitem__) == greedy
    assert engine.leases.tokens(lease) == PREFIX and backend.seq_pos_max(0) == len(PREFIX) - 1
    longer = engine.leases.next_token_logits(lease, [*PREFIX, greedy])  # one token past the KV
    assert engine.leases.tokens(lease) == [*PREFIX, greedy]
    assert len(longer) == len(logits)
    with pytest.raises(InvalidOptionError):
        engine.leases.next_token_logits(lease, [9, 9])
    engine.check_integrity()


def test_lease_ops_refuse_while_a_request_runs_on_the_lease():
    engine, _ = make_engine(n_parallel=1)
    lease = engine.lease()
    submit(engine, 1, PREFIX, max_tokens=50, lease_id=lease)
    engine.tick()
    with pytest.raises(InvalidOptionError):
        engine.leases.save(lease)
    with pytest.raises(InvalidOptionError):
        engine.leases.clear(lease)


def test_release_cancels_work_and_leaves_a_reusable_prefix_in_scope():
    engine, _ = make_engine(n_parallel=1)
    lease = engine.lease("team")
    submit(engine, 1, PREFIX, max_tokens=0, cache_scope="team", lease_id=lease)
    drain(engine)
    running = submit(engine, 2, [*PREFIX, 3], max_tokens=50, cache_scope="team", lease_id=lease)
    engine.tick()
    engine.release(lease)
    assert running.finish_reason == "cancelled"
    other = submit(engine, 3, [*PREFIX, 9], max_tokens=1, cache_scope="other")
    drain(engine)
    assert other.final.timings.reused_tokens == 0
    same = submit(engine, 4, [*PREFIX, 9], max_tokens=1, cache_scope="team")
    drain(engine)
    assert same.final.timings.reused_tokens == 0  # "other" took the slot and replaced it


def test_leasing_under_another_key_drops_the_old_cache():
    engine, backend = make_engine(n_parallel=1)
    submit(engine, 1, PREFIX, max_tokens=1, cache_scope="a")
    drain(engine)
    lease = engine.lease("b", "lora")
    assert engine.leases.tokens(lease) == [] and backend.seq_pos_max(0) == -1
    engine.release(lease)
    lease = engine.lease("b", "lora")
    assert engine.leases.tokens(lease) == []


def test_lease_overflow_reports_resident_tokens():
    engine, _ = make_engine(n_parallel=2, n_ctx=64, unified=False)  # 32 per sequence
    lease = engine.lease()
    submit(engine, 1, PREFIX, max_tokens=0, lease_id=lease)
    drain(engine)
    with pytest.raises(ContextOverflowError) as info:
        submit(engine, 2, [*PREFIX, 1, 2], max_tokens=5, lease_id=lease)
    assert (info.value.resident_tokens, info.value.additional_tokens) == (30, 7)


def test_unknown_lease_in_a_request():
    engine, _ = make_engine()
    with pytest.raises(UnknownLeaseError):
        submit(engine, 1, PREFIX, lease_id=12345)
