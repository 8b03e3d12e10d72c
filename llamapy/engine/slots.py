"""Slots (one KV sequence each) and the slot pool: routing, LRU, affinity and leases.

Invariant: ``slot.cached`` lists exactly the tokens whose KV is resident in sequence
``slot.seq_id``, by position (``backend.seq_pos_max(seq_id) == len(cached) - 1``). While a run
is on the slot, ``cached`` is a prefix of ``run.tokens`` (prompt + generated).

A run pinned by ``slot_id`` (llama-server's ``id_slot``) takes that slot only, waiting while it
is busy or leased, and only while the slot is empty or its own tenant's: a slot holding another
tenant's request, lease or KV is a :class:`~llamapy.errors.PermissionDeniedError` for it (at
submission, or when the slot changes hands while it waits; :meth:`SlotPool.pinned_slot`), as
llama-server's slot actions are for another tenant's slot. Naming a slot never evicts another
tenant's KV.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from llamapy.engine.cache.checkpoints import Checkpoints
from llamapy.engine.cache.ram import common_prefix
from llamapy.engine.lease_idle import LeaseIdle
from llamapy.engine.request import CacheKey, Run
from llamapy.engine.states import (
    FREE_SLOT_STATES,
    RUNNING_SLOT_STATES,
    SlotState,
    StateMachine,
    slot_machine,
)
from llamapy.errors import PermissionDeniedError, UnknownLeaseError

__all__ = ["Slot", "SlotPool"]


@dataclass(slots=True, eq=False)
class Slot:
    """One KV sequence and the run using it (if any)."""

    slot_id: int
    machine: StateMachine[SlotState] = field(default_factory=slot_machine)
    cached: list[int] = field(default_factory=list)
    key: CacheKey | None = None
    last_used: int = 0
    #: ``(scope, session)`` of the last session that ran here (:attr:`Request.affinity_key`).
    affinity_key: Hashable | None = None
    lease_id: int | None = None
    #: The lease's idle bound (None: unbounded, or not leased); see :mod:`~.lease_idle`.
    lease_idle: LeaseIdle | None = None
    run: Run | None = None
    #: Restore points inside ``cached`` (a backend that cannot trim; see
    #: :mod:`llamapy.engine.cache.checkpoints`).
    checkpoints: Checkpoints = field(default_factory=Checkpoints)

    @property
    def seq_id(self) -> int:
        """The backend sequence of this slot."""
        return self.slot_id

    @property
    def state(self) -> SlotState:
        """Current state."""
        return self.machine.state

    @property
    def is_free(self) -> bool:
        """No run on the slot (IDLE or LEASED)."""
        return self.machine.state in FREE_SLOT_STATES

    @property
    def is_idle(self) -> bool:
        """Free and not leased: may be routed to, purged and evicted."""
        return self.machine.state is SlotState.IDLE

    @property
    def remaining_prefill(self) -> int:
        """Prompt tokens of the run still to compute."""
        return len(self.run.prompt) - len(self.cached) if self.run else 0

    def held_by_other(self, tenant: str | None) -> bool:
        """Whether the slot holds KV of a tenant other than ``tenant``, or will when its run
        or lease ends: its run is another tenant's, or (no run) it is leased or holds tokens
        filed under another tenant. An empty, unleased slot is no one's."""
        if self.run is not None:
            return self.run.request.options.tenant != tenant
        if self.lease_id is None and not self.cached:
            return False
        return (self.key.tenant if self.key is not None else None) != tenant


class SlotPool:
    """The slots, with routing (session, longest cached prefix, LRU) and leases."""

    def __init__(self, n_slots: int, *, min_route_share: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.slots = [Slot(slot_id=i) for i in range(n_slots)]
        self.min_route_share = min_route_share
        self._now = clock
        self._clock = 0
        self._affinity: dict[Hashable, int] = {}
        self._leases: dict[int, int] = {}
        self._next_lease = 1

    def touch(self, slot: Slot) -> None:
        """Mark ``slot`` most recently used."""
        self._clock += 1
        slot.last_used = self._clock

    def idle(self) -> list[Slot]:
        """Routable slots, least recently used first."""
        return sorted((s for s in self.slots if s.is_idle), key=lambda s: s.last_used)

    def running(self) -> list[Slot]:
        """Slots with a run."""
        return [s for s in self.slots if s.machine.state in RUNNING_SLOT_STATES]

    def any_running(self) -> bool:
        """Whether any slot has a run (asked several times a tick: a plain loop, no generator)."""
        for s in self.slots:  # noqa: SIM110
            if s.machine.state in RUNNING_SLOT_STATES:
                return True
        return False

    # --- routing -------------------------------------------------------------------------------

    def route(self, run: Run) -> Slot | None:
        """The slot ``run`` should take now, or None if it must wait."""
        lease_id = run.request.lease_id
        if lease_id is not None:
            slot = self.leased_slot(lease_id)
            return slot if slot.state is SlotState.LEASED else None
        pinned = self.pinned_slot(run)
        if pinned is not None:
            return pinned if pinned.is_idle else None
        idle = self.idle()
        if not idle:
            return None
        return self._affine_slot(run, idle) or self._prefix_slot(run, idle) or idle[0]

    def pinned_slot(self, run: Run) -> Slot | None:
        """The slot ``run``'s ``slot_id`` names (modulo the slot count; None without one);
        :class:`~llamapy.errors.PermissionDeniedError` when it is :meth:`held by another tenant
        <Slot.held_by_other>` (the message names no tenant)."""
        slot_id = run.request.options.slot_id
        if slot_id is None:
            return None
        slot = self.slots[slot_id % len(self.slots)]
        if slot.held_by_other(run.request.options.tenant):
            raise PermissionDeniedError(
                f"id_slot {slot_id}: slot {slot.slot_id} holds another tenant's cache; send the "
                "request without id_slot, or name a slot that is empty or this tenant's")
        return slot

    def affine_slot_free(self, run: Run) -> bool:
        """Whether ``run``'s session last ran on a slot that is routable now."""
        session = run.request.affinity_key
        slot_id = self._affinity.get(session) if session is not None else None
        return slot_id is not None and self.slots[slot_id].is_idle

    def _affine_slot(self, run: Run, idle: list[Slot]) -> Slot | None:
        session = run.request.affinity_key
        if session is None or session not in self._affinity:
            return None
        slot = self.slots[self._affinity[session]]
        return slot if slot in idle else None

    def _prefix_slot(self, run: Run, idle: list[Slot]) -> Slot | None:
        if not run.cache_prompt or not run.prompt or self.min_route_share <= 0:
            return None
        best, best_n = None, 0
        for slot in idle:  # LRU first, so ties go to the least recently used
            if slot.key == run.key:
                n = common_prefix(slot.cached, run.prompt)
                if n > best_n:
                    best, best_n = slot, n
        return best if best_n >= max(1, self.min_route_share * len(run.prompt)) else None

    def assign(self, run: Run, slot: Slot) -> None:
        """Put ``run`` on ``slot`` (IDLE/LEASED -> PREFILLING)."""
        slot.machine.fire("assign")
        slot.run, run.slot = run, slot
        run.timings.slot_id = slot.slot_id
        session = run.request.affinity_key
        if session is not None:
            if self._affinity.get(slot.affinity_key) == slot.slot_id:  # one session per slot:
                del self._affinity[slot.affinity_key]  # the map stays as small as the pool
            self._affinity[session] = slot.slot_id
            slot.affinity_key = session
        self.touch(slot)

    def unassign(self, slot: Slot) -> None:
        """Take the run off ``slot`` (-> IDLE, or LEASED for a leased slot)."""
        slot.machine.fire("finish" if slot.lease_id is None else "finish_leased")
        if slot.lease_idle is not None:
            slot.lease_idle.used_at = self._now()
        if slot.run is not None:
            slot.run.slot = None
        slot.run = None
        self.touch(slot)

    # --- leases --------------------------------------------------------------------------------

    def lease(self, key: CacheKey, *, idle_s: float | None = None,
              on_expire: Callable[[], None] | None = None) -> Slot | None:
        """Lease an idle slot, preferring one whose cache has ``key`` (most tokens), else LRU;
        ``idle_s``/``on_expire``: its idle bound (:mod:`~llamapy.engine.lease_idle`)."""
        idle = self.idle()
        if not idle:
            return None
        same = [s for s in idle if s.key == key and s.cached]
        slot = max(same, key=lambda s: len(s.cached)) if same else idle[0]
        slot.machine.fire("lease")
        slot.lease_id = self._next_lease
        self._leases[slot.lease_id] = slot.slot_id
        self._next_lease += 1
        if idle_s is not None:
            slot.lease_idle = LeaseIdle(idle_s, self._now(), on_expire)
        return slot

    def leased_slot(self, lease_id: int) -> Slot:
        """The slot held by ``lease_id`` (a use of the lease: its idle time restarts);
        ``UnknownLeaseError`` if there is none."""
        slot_id = self._leases.get(lease_id)
        if slot_id is None:
            raise UnknownLeaseError(lease_id)
        slot = self.slots[slot_id]
        if slot.lease_idle is not None:
            slot.lease_idle.used_at = self._now()
        return slot

    def release(self, lease_id: int) -> Slot:
        """End a lease (the slot must be free): LEASED -> IDLE."""
        slot = self.leased_slot(lease_id)
        slot.machine.fire("release")
        del self._leases[lease_id]
        slot.lease_id = None
        slot.lease_idle = None
        self.touch(slot)
        return slot

    @property
    def leases(self) -> dict[int, int]:
        """lease id -> slot id."""
        return dict(self._leases)
