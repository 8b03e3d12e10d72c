"""Engine invariants (:func:`check_engine`) and the stats snapshot (:func:`build_stats`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from llamapy.engine.states import RequestState, SlotState
from llamapy.engine.stats import Counters, EngineStats, SlotInfo

if TYPE_CHECKING:
    from llamapy.engine.engine import Engine
    from llamapy.engine.request import CacheKey
    from llamapy.engine.slots import Slot

__all__ = ["build_stats", "check_engine"]


#: The states of a run placed on a slot.
ON_SLOT = frozenset({RequestState.RESOLVING, RequestState.RUNNING, RequestState.ENDING})


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(f"engine integrity: {message}")


def check_engine(engine: Engine) -> None:
    """Raise ``AssertionError`` if any invariant is broken: slot states and leases, KV
    accounting against the backend, every request in exactly one place, queue bound, tenant
    counts and bound, the tenants' counters adding up to the totals, RAM and disk cache
    budgets (per tenant too), context checkpoints within their bounds."""
    for slot in engine.pool.slots:
        _check_slot(engine, slot)
    _check_leases(engine)
    _check_places(engine)
    engine.tenants.check_integrity(engine.runs.values())
    engine.tenant_counts.check_integrity(engine.counters)
    engine.ram.check_integrity()
    engine.disk.check_integrity()


def _check_slot(engine: Engine, slot: Slot) -> None:
    sid = f"slot {slot.slot_id}"
    _require(isinstance(slot.state, SlotState), f"{sid}: illegal state {slot.state!r}")
    pos_max = engine.backend.seq_pos_max(slot.seq_id)
    _require(pos_max == len(slot.cached) - 1,
             f"{sid}: backend holds {pos_max + 1} positions, engine believes {len(slot.cached)}")
    _check_checkpoints(engine, slot, sid)
    run = slot.run
    _require((run is None) == slot.is_free, f"{sid}: run {run!r} in state {slot.state}")
    if run is None:
        return
    _require(run.slot is slot and run.state in ON_SLOT, f"{sid}: run not bound")
    if not run.resolved:
        return
    _require(slot.key == run.key, f"{sid}: cache key {slot.key!r} != run's {run.key!r}")
    n = len(slot.cached)
    _require(slot.cached == run.tokens[:n], f"{sid}: KV is not a prefix of the run's tokens")
    if slot.state is SlotState.DECODING and not run.ending:
        _require(n == len(run.tokens) - 1, f"{sid}: decoding with {n} of {len(run.tokens)}")
    if slot.state is SlotState.PREFILLING:
        _require(len(run.tokens) == len(run.prompt), f"{sid}: sampled while prefilling")


def _check_checkpoints(engine: Engine, slot: Slot, sid: str) -> None:
    """A slot's checkpoints within their bounds (none where they are off) and inside its KV."""
    rewinder, held = engine.prefix.rewinder, slot.checkpoints
    bound = rewinder.max_count if rewinder.active else 0
    _require(len(held) <= bound and held.nbytes <= rewinder.max_bytes,
             f"{sid}: {len(held)} checkpoints of {held.nbytes} bytes over the bounds")
    _require(all(p <= len(slot.cached) for p in held.positions),
             f"{sid}: a checkpoint past the cached tokens")


def _check_leases(engine: Engine) -> None:
    leases = engine.pool.leases
    for slot in engine.pool.slots:
        held = slot.lease_id is not None
        _require(held == (slot.lease_id in leases and leases[slot.lease_id] == slot.slot_id),
                 f"slot {slot.slot_id}: lease bookkeeping")
        _require(held or slot.state is not SlotState.LEASED,
                 f"slot {slot.slot_id}: LEASED without a lease")
        _require(not held or slot.state is not SlotState.IDLE,
                 f"slot {slot.slot_id}: IDLE while leased")


def _check_places(engine: Engine) -> None:
    queue = engine.queue
    running = [s.run for s in engine.pool.slots if s.run is not None]
    _require(all(r.state is RequestState.QUEUED and r.slot is None for r in queue),
             "queued run not in QUEUED state")
    placed = [r.request_id for r in (*queue, *running)]
    _require(len(placed) == len(set(placed)), "a request is in two places")
    _require(set(placed) == set(engine.runs), "active runs and queue/slots disagree")
    max_queue = engine.config.max_queue
    _require(max_queue == 0 or len(queue) <= max_queue,
             f"queue {len(queue)} over max_queue {max_queue}")


def build_stats(engine: Engine) -> EngineStats:
    """The :class:`EngineStats` snapshot of ``engine``."""
    slots = engine.pool.slots
    count = {state: sum(s.state is state for s in slots) for state in SlotState}
    backend = engine.backend
    return EngineStats(
        n_parallel=len(slots), n_batch=engine.n_batch, n_ctx=backend.n_ctx,
        n_ctx_seq=backend.n_ctx_seq, chunk_size=engine.config.chunk_size,
        max_queue=engine.config.max_queue,
        batch_strategy=getattr(engine.strategy, "name", type(engine.strategy).__name__),
        slots_active=count[SlotState.PREFILLING] + count[SlotState.DECODING],
        slots_idle=count[SlotState.IDLE], slots_leased=count[SlotState.LEASED],
        slots_prefilling=count[SlotState.PREFILLING], slots_decoding=count[SlotState.DECODING],
        queue_depth=len(engine.queue), ram_cache_entries=len(engine.ram),
        ram_cache_bytes=engine.ram.total_bytes, ram_cache_budget_bytes=engine.ram.budget_bytes,
        ram_cache_evictions=engine.ram.num_evictions,
        ram_cache_pinned_bytes=engine.ram.pins.total_bytes,
        **_disk_stats(engine),
        counters=_copy(engine.counters, engine.disk.num_writes),
        instability_events=list(engine.instability_events),
        slots=[_slot_info(slot) for slot in slots],
        tenants=engine.tenant_counts.snapshot(engine.runs.values()),
    )


def _slot_info(slot: Slot) -> SlotInfo:
    """One slot's info, all of one tenant's: a run's key (its KV may still be another's until
    its prefix is resolved: then no cached tokens are counted), a session only of that key."""
    run = slot.run
    key = run.key if run is not None else slot.key
    return SlotInfo(
        slot_id=slot.slot_id, state=slot.state.value,
        cached_tokens=len(slot.cached) if run is None or slot.key == key else 0,
        cache_scope=key.cache_scope if key else None, tenant=key.tenant if key else None,
        session=_session(slot.affinity_key, key),
        lease_id=slot.lease_id, request_id=None if run is None else run.request_id,
        prompt_tokens=0 if run is None else len(run.prompt),
        generated_tokens=0 if run is None else run.num_generated,
        num_computed_tokens=len(slot.cached) if run is not None and run.resolved else 0,
        checkpoints=tuple(slot.checkpoints.positions), checkpoint_bytes=slot.checkpoints.nbytes,
    )


def _session(affinity_key: object, key: CacheKey | None) -> object:
    """The session of a slot's ``(scope, session)`` affinity key if that scope is ``key``'s
    (a restored slot keeps the affinity of the last session that ran on it)."""
    if not isinstance(affinity_key, tuple) or key is None or affinity_key[0] != key.scope:
        return None
    return affinity_key[1]


def _disk_stats(engine: Engine) -> dict[str, int]:
    disk = engine.disk
    store = disk.store
    return {"disk_cache_entries": len(disk), "disk_cache_bytes": disk.total_bytes,
            "disk_cache_budget_bytes": disk.budget_bytes,
            "disk_cache_evictions": disk.num_evictions,
            "disk_cache_bad_files": 0 if store is None else store.num_bad_files}


def _copy(counters: Counters, num_disk_writes: int) -> Counters:
    """A snapshot of the counters (the disk writes are counted by the disk cache's writer)."""
    return replace(counters, finish_reasons=dict(counters.finish_reasons),
                   reused=dict(counters.reused), restores=dict(counters.restores),
                   restore_failures=dict(counters.restore_failures),
                   draft_accepted_per_pos=list(counters.draft_accepted_per_pos),
                   num_disk_writes=num_disk_writes)
