"""Slot actions (``Engine.slot_ops``, the idle-slot view of the KV operations) on the fake
backend: only idle slots, the saved key travels with the KV (a restored prefix serves its own
scope only), and a refused restore leaves the slot empty."""

from __future__ import annotations

import pytest

from llamapy.engine import Engine, EngineConfig, Request, resolve_request_options
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.kv_ops import KvState
from llamapy.engine.request import CacheKey
from llamapy.engine.testing import Recorder, drain
from llamapy.errors import InvalidOptionError, SlotBusyError

PROMPT = list(range(1, 41))


def engine() -> tuple[Engine, FakeBackend]:
    backend = FakeBackend(n_ctx=512, n_seq_max=2)
    return Engine(backend, EngineConfig(n_parallel=2)), backend


def run(eng: Engine, rid: int, scope: str | None, max_tokens: int = 4) -> Recorder:
    sink = Recorder()
    options = resolve_request_options({"max_tokens": max_tokens, "cache_scope": scope,
                                       "temp": 0.0})
    eng.submit(Request(rid, PROMPT, options, sink))
    return sink


def test_save_erase_restore_keeps_the_scope() -> None:
    eng, backend = engine()
    first = run(eng, 1, "a")
    drain(eng, each=eng.check_integrity)
    slot = next(s for s in eng.pool.slots if s.cached)
    saved = eng.slot_ops.save(slot.slot_id)
    assert saved.key == CacheKey("a") and len(saved.token_ids) == len(slot.cached)
    assert eng.slot_ops.clear(slot.slot_id) == len(saved.token_ids) and not slot.cached
    assert eng.slot_ops.restore(slot.slot_id, saved)
    assert slot.cached == list(saved.token_ids) and slot.key == CacheKey("a")
    again, other = run(eng, 2, "a"), run(eng, 3, "b")
    drain(eng, each=lambda: (eng.check_integrity(), backend.check_integrity()))
    assert again.tokens == first.tokens == other.tokens
    assert again.final.timings.reused_tokens == len(PROMPT) - 1
    assert other.final.timings.reused_tokens == 0  # another scope never reads it


def test_only_idle_slots_take_actions() -> None:
    eng, _ = engine()
    run(eng, 1, None, max_tokens=50)
    eng.tick()
    busy = next(s for s in eng.pool.slots if not s.is_free)
    for action in (lambda: eng.slot_ops.save(busy.slot_id),
                   lambda: eng.slot_ops.clear(busy.slot_id)):
        with pytest.raises(SlotBusyError):
            action()
    lease = eng.lease()
    assert lease is not None
    leased = eng.pool.leased_slot(lease)
    with pytest.raises(SlotBusyError):
        eng.slot_ops.clear(leased.slot_id)
    with pytest.raises(InvalidOptionError, match="invalid slot id"):
        eng.slot_ops.clear(5)


def test_a_refused_restore_leaves_the_slot_empty() -> None:
    eng, backend = engine()
    run(eng, 1, None)
    drain(eng)
    slot = next(s for s in eng.pool.slots if s.cached)
    saved = eng.slot_ops.save(slot.slot_id)
    broken = KvState(saved.state[:10], saved.token_ids, saved.key)
    assert not eng.slot_ops.restore(slot.slot_id, broken)
    assert not slot.cached and backend.seq_pos_max(slot.seq_id) == -1
    eng.check_integrity()


def tenant_run(eng: Engine, rid: int, tenant: str, session: str,
               slot_id: int | None = 0) -> Recorder:
    sink = Recorder()
    options = resolve_request_options({"max_tokens": 4, "tenant": tenant, "session": session,
                                       "slot_id": slot_id, "temp": 0.0})
    eng.submit(Request(rid, PROMPT, options, sink))
    return sink


def test_holder_names_the_tenant_of_the_slots_kv() -> None:
    eng, _ = engine()
    assert eng.slot_ops.holder(0) == (None, 0)
    tenant_run(eng, 1, "a", "s")
    drain(eng)
    assert eng.slot_ops.holder(0) == ("a", len(eng.pool.slots[0].cached))
    eng.slot_ops.clear(0)
    assert eng.slot_ops.holder(0) == ("a", 0)
    with pytest.raises(InvalidOptionError, match="invalid slot id"):
        eng.slot_ops.holder(2)


def test_a_slots_info_is_all_of_one_tenant() -> None:
    eng, _ = engine()
    tenant_run(eng, 1, "a", "session-a")
    drain(eng)
    saved = eng.slot_ops.save(0)
    info = eng.stats().slots[0]
    assert (info.tenant, info.session, info.cached_tokens) == (
        "a", "session-a", len(eng.pool.slots[0].cached))
    # b's run routed onto a's slot (the least recently used; slot_id may not name another
    # tenant's), its prefix not resolved yet: b's key, none of a's KV counted
    eng.pool.touch(eng.pool.slots[1])
    tenant_run(eng, 2, "b", "session-b", slot_id=None)
    info = eng.stats().slots[0]
    assert (info.tenant, info.session, info.cached_tokens, info.request_id) == (
        "b", "session-b", 0, 2)
    drain(eng)
    # a's file restored where b's session ran: a's KV, no session of b's
    eng.slot_ops.clear(0)
    assert eng.slot_ops.restore(0, saved)
    info = eng.stats().slots[0]
    assert (info.tenant, info.session, info.cached_tokens) == ("a", None, len(saved.token_ids))
    eng.check_integrity()
