"""Parking: with a unified KV cache and the RAM cache on, an idle slot's prefix moves to RAM
(its cells freed) while other slots decode, and comes back from RAM when it is asked for."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, ref, submit

from llamapy.engine import EngineTuning
from llamapy.engine.testing import drain

PROMPT_A = list(range(1, 41))
PROMPT_B = list(range(101, 141))


def _engine(**kw):
    kw.setdefault("prompt_cache_ram_mb", 1)
    kw.setdefault("tuning", EngineTuning(ram_min_tokens=8))
    return make_engine(n_parallel=2, n_ctx=512, **kw)


def _a_then_b(engine):
    """A runs alone and finishes on one slot; then B decodes on the other."""
    a = submit(engine, "a", PROMPT_A, max_tokens=3, temp=0.0)
    drain(engine)
    slot_a = next(s for s in engine.pool.slots if s.cached)
    submit(engine, "b", PROMPT_B, max_tokens=3, temp=0.0)
    drain(engine, each=engine.check_integrity)
    return a, slot_a


def test_an_idle_prefix_is_parked_in_ram_and_restored_from_there():
    engine, backend = _engine()
    a, slot_a = _a_then_b(engine)
    assert slot_a.cached == [] and backend.seq_pos_max(slot_a.seq_id) == -1
    assert engine.counters.num_parked_slots == 1
    assert engine.ram.covers(slot_a.key, [*PROMPT_A, *a.tokens[:-1]])
    again = submit(engine, "a2", [*PROMPT_A, 7], max_tokens=3, temp=0.0)
    drain(engine, each=engine.check_integrity)
    assert again.final.timings.reuse_source == "ram"
    assert again.final.timings.reused_tokens == len(PROMPT_A)
    assert again.tokens == ref(backend, [*PROMPT_A, 7], 3, temp=0.0)


@pytest.mark.parametrize("kw", [
    {"prompt_cache_ram_mb": 0},                                  # no RAM cache
    {"unified": False},                                          # cells per sequence
    {"cache_idle_slots": False},
    {"tuning": EngineTuning(ram_min_tokens=64)},                 # too short for RAM
], ids=["ram-off", "split-kv", "parking-off", "too-short"])
def test_an_idle_prefix_stays_resident_otherwise(kw):
    engine, backend = _engine(**kw)
    _, slot_a = _a_then_b(engine)
    assert slot_a.cached[:len(PROMPT_A)] == PROMPT_A
    assert engine.counters.num_parked_slots == 0
    again = submit(engine, "a2", [*PROMPT_A, 7], max_tokens=3, temp=0.0)
    drain(engine, each=engine.check_integrity)
    assert again.final.timings.reuse_source == "own"
    assert again.tokens == ref(backend, [*PROMPT_A, 7], 3, temp=0.0)


def test_a_leased_slot_is_never_parked():
    engine, _ = _engine()
    lease = engine.lease()
    submit(engine, "l", PROMPT_A, max_tokens=2, temp=0.0, lease_id=lease)
    drain(engine)
    leased = engine.pool.leased_slot(lease)
    submit(engine, "b", PROMPT_B, max_tokens=3, temp=0.0)
    drain(engine, each=engine.check_integrity)
    assert leased.cached[:len(PROMPT_A)] == PROMPT_A
    assert engine.counters.num_parked_slots == 0
