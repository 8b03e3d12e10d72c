"""Admission and routing: session affinity, longest cached prefix in scope, LRU, slots pinned
by ``slot_id`` (llama-server's ``id_slot``)."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, ref, submit

from llamapy.engine import DoneEvent, ErrorEvent, RequestOptions
from llamapy.engine.testing import drain
from llamapy.errors import InvalidOptionError, PermissionDeniedError

A = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
B = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]


def slot_of(engine, rid) -> int:
    return engine.runs[rid].slot.slot_id


def warm(engine, prompts: dict) -> None:
    """Run one request per slot so each slot caches a known prompt."""
    for rid, (prompt, kw) in prompts.items():
        submit(engine, rid, prompt, max_tokens=1, **kw)
    drain(engine)


def test_session_goes_back_to_its_slot():
    engine, _ = make_engine(n_parallel=3)
    submit(engine, "a", A, max_tokens=1, session="s1")
    submit(engine, "b", B, max_tokens=1)
    first = slot_of(engine, "a")
    drain(engine)
    submit(engine, "c", B, max_tokens=1, session="s1")  # prefix would point elsewhere
    assert slot_of(engine, "c") == first


def test_busy_session_slot_falls_back_to_another_slot():
    engine, _ = make_engine(n_parallel=2)
    submit(engine, "a", A, max_tokens=50, session="s1")
    submit(engine, "b", A, max_tokens=1, session="s1")
    assert slot_of(engine, "b") != slot_of(engine, "a")


def test_longest_cached_prefix_in_the_same_scope_wins():
    engine, _ = make_engine(n_parallel=3)
    warm(engine, {"a": (A, {}), "b": (B, {}), "c": (A[:3] + B, {})})
    slots = {s.slot_id: list(s.cached) for s in engine.pool.slots}
    submit(engine, "x", [*B[:8], 1], max_tokens=1)
    chosen = slot_of(engine, "x")
    assert slots[chosen][:8] == B[:8]


def test_prefix_in_another_scope_does_not_attract_routing():
    engine, _ = make_engine(n_parallel=2)
    warm(engine, {"a": (A, {"cache_scope": "t1"}), "b": (B, {"cache_scope": "t1"})})
    b_slot = next(s.slot_id for s in engine.pool.slots if s.cached[:3] == B[:3])
    a_slot = 1 - b_slot
    engine.pool.touch(engine.pool.slots[b_slot])  # make the B slot most recently used
    submit(engine, "x", [*B, 1], max_tokens=1, cache_scope="t2")
    assert slot_of(engine, "x") == a_slot  # LRU, not the B prefix of another scope


def test_least_recently_used_slot_when_nothing_matches():
    engine, _ = make_engine(n_parallel=3)
    warm(engine, {"a": (A, {}), "b": (B, {}), "c": ([30, 31, 32], {})})
    lru = min(engine.pool.slots, key=lambda s: s.last_used).slot_id
    submit(engine, "x", [40, 41, 42, 43], max_tokens=1)
    assert slot_of(engine, "x") == lru


def test_a_small_shared_share_does_not_route():
    engine, _ = make_engine(n_parallel=2)
    warm(engine, {"a": ([5, *A], {}), "b": (B, {})})
    lru = min(engine.pool.slots, key=lambda s: s.last_used).slot_id
    long_prompt = [5, *range(30, 60)]  # shares 1 token of 31 (< 10%)
    submit(engine, "x", long_prompt, max_tokens=1)
    assert slot_of(engine, "x") == lru


@pytest.mark.parametrize(("similarity", "routes"), [(0.1, True), (0.5, False), (0.0, False)])
def test_slot_prompt_similarity_sets_the_share_that_routes(similarity: float, routes: bool):
    engine, _ = make_engine(n_parallel=2, slot_prompt_similarity=similarity)
    warm(engine, {"a": (A, {}), "b": (B, {})})
    a_slot = next(s.slot_id for s in engine.pool.slots if s.cached[:3] == A[:3])
    engine.pool.touch(engine.pool.slots[a_slot])  # the A slot is the most recently used
    submit(engine, "x", [*A[:4], *range(30, 40)], max_tokens=1)  # shares 4 of 14 (29%)
    assert (slot_of(engine, "x") == a_slot) is routes  # 0 = off: least recently used


def test_freed_slot_serves_its_session_first():
    engine, _ = make_engine(n_parallel=1)
    submit(engine, "a", A, max_tokens=3, session="s1")
    submit(engine, "q1", B, max_tokens=1)
    submit(engine, "q2", [*A, 3], max_tokens=1, session="s1")
    while "a" in engine.runs:
        engine.tick()
    engine.tick()
    assert "q2" not in engine.runs or engine.runs["q2"].slot is not None
    assert engine.runs["q1"].slot is None


def test_fifo_without_sessions():
    engine, _ = make_engine(n_parallel=1)
    finished: list[str] = []
    for rid in ("a", "q1", "q2", "q3"):
        sink = submit(engine, rid, B, max_tokens=2, temp=0.0)
        sink.on_event = lambda e, rid=rid: finished.append(rid) if isinstance(e, DoneEvent) else 0
    drain(engine)
    assert finished == ["a", "q1", "q2", "q3"]


def test_a_pinned_request_runs_on_its_slot_and_waits_for_it():
    engine, backend = make_engine(n_parallel=2)
    submit(engine, "busy", A, max_tokens=6, slot_id=1)
    assert slot_of(engine, "busy") == 1
    pinned = submit(engine, "pinned", B, max_tokens=2, slot_id=1, temp=0.0)
    free = submit(engine, "free", [30, 31, 32], max_tokens=2)
    engine.tick()
    assert engine.runs["pinned"].slot is None  # slot 1 is busy; slot 0 is not for it
    assert slot_of(engine, "free") == 0
    submit(engine, "late", [40, 41], max_tokens=1)  # queued behind it, must not take slot 1
    while engine.runs["pinned"].slot is None:
        assert engine.tick()
    assert slot_of(engine, "pinned") == 1
    drain(engine)
    assert pinned.tokens == ref(backend, B, 2, temp=0.0)
    assert isinstance(free.final, DoneEvent)
    assert isinstance(pinned.final, DoneEvent) and pinned.final.timings.slot_id == 1


def test_a_slot_id_past_the_last_slot_wraps_and_minus_one_means_any():
    engine, _ = make_engine(n_parallel=2)
    submit(engine, "wrapped", A, max_tokens=3, slot_id=3)
    assert slot_of(engine, "wrapped") == 1
    submit(engine, "any", B, max_tokens=1, slot_id=-1)
    assert slot_of(engine, "any") == 0
    with pytest.raises(InvalidOptionError, match="slot_id"):
        RequestOptions(slot_id=-2)
    with pytest.raises(InvalidOptionError, match="slot_id"):
        RequestOptions(slot_id=1.5)  # type: ignore[arg-type]


# --- slot_id and tenants: naming a slot never takes another tenant's ----------------------------


def test_a_pin_on_a_slot_holding_another_tenants_kv_is_refused_and_changes_nothing():
    engine, _ = make_engine(n_parallel=2)
    submit(engine, "acme", A, max_tokens=2, slot_id=0, tenant="acme")
    drain(engine)
    held = list(engine.pool.slots[0].cached)
    for pinned in (0, 2):  # (an id past the last slot wraps onto slot 0)
        with pytest.raises(PermissionDeniedError, match="another tenant") as refused:
            submit(engine, "beta", B, max_tokens=2, slot_id=pinned, tenant="beta")
        assert "acme" not in str(refused.value)
    assert not engine.runs and not engine.queue
    slot = engine.pool.slots[0]
    assert slot.cached == held and slot.key is not None and slot.key.tenant == "acme"
    submit(engine, "again", [*A, 1], max_tokens=1, slot_id=0, tenant="acme")
    assert slot_of(engine, "again") == 0  # its own: honoured
    submit(engine, "beta", B, max_tokens=1, slot_id=1, tenant="beta")  # an empty one: too
    assert slot_of(engine, "beta") == 1
    drain(engine)
    engine.check_integrity()


def test_a_pin_on_another_tenants_running_or_leased_slot_is_refused():
    engine, _ = make_engine(n_parallel=3)
    submit(engine, "busy", A, max_tokens=8, slot_id=0, tenant="acme")
    lease = engine.lease(tenant="acme")
    assert lease is not None
    leased = engine.pool.leased_slot(lease).slot_id
    for pinned in (0, leased):
        with pytest.raises(PermissionDeniedError):
            submit(engine, "beta", B, max_tokens=1, slot_id=pinned, tenant="beta")
    submit(engine, "mine", B, max_tokens=1, slot_id=leased, tenant="acme")
    engine.tick()
    assert engine.runs["mine"].slot is None  # its own tenant's lease: it waits, as before
    engine.release(lease)
    drain(engine)
    engine.check_integrity()


def test_a_pinned_run_whose_slot_changes_hands_while_it_waits_ends_refused():
    engine, _ = make_engine(n_parallel=1)
    submit(engine, "own", A, max_tokens=4, slot_id=0, tenant="acme")
    waiting = submit(engine, "waiting", A, max_tokens=1, slot_id=0, tenant="acme")
    engine.cancel("own")
    submit(engine, "other", B, max_tokens=4, tenant="beta")  # never served: its turn first
    engine.tick()
    assert slot_of(engine, "other") == 0
    drain(engine)
    assert isinstance(waiting.final, ErrorEvent)
    assert isinstance(waiting.final.exc, PermissionDeniedError)
    assert engine.pool.slots[0].key is not None and engine.pool.slots[0].key.tenant == "beta"
    engine.check_integrity()


def test_a_pin_on_an_emptied_slot_of_another_tenant_is_honoured():
    engine, _ = make_engine(n_parallel=2)
    submit(engine, "acme", A, max_tokens=1, slot_id=1, tenant="acme")
    drain(engine)
    engine.slot_ops.clear(1)  # filed under acme, holding nothing: no one's KV to evict
    submit(engine, "beta", B, max_tokens=1, slot_id=1, tenant="beta")
    assert slot_of(engine, "beta") == 1
    drain(engine)
