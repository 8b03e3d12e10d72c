"""Admission and routing: session affinity, longest cached prefix in scope, LRU."""

from __future__ import annotations

from engine_helpers import make_engine, submit

from llamapy.engine import DoneEvent
from llamapy.engine.testing import drain

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
