"""Fair share between tenants (``RequestOptions.tenant``; None, the default tenant, is one
too): the order queued runs of several tenants are offered slots, and the bound on the
requests one tenant may hold.

**Admission** (:meth:`Tenants.interleave`). Each tenant's queued runs keep their own order (its
lease-bound, pinned and affine runs first, then the batch strategy's ``admission_order``: see
:class:`~llamapy.engine.admission.Admission`). Across tenants, slots go round robin, least
recently served first: the tenants with queued runs take turns in the order of the last time
one of their runs took a slot that is not leased (never: first; ties: the oldest queued run
first). At its turn a tenant's runs are tried in its order until one takes a slot; then the
tenant goes behind every other (it got the last slot), or its turn ends with none placed. With a
single tenant this is the engine's order, unchanged. (A new request takes a free slot at
submission only when no request without a lease is queued, so it never passes a queued one.)

**The bound it gives.** Say tenant ``B`` waits: it has a queued run that any idle slot can
take (no lease, no pinned ``slot_id``). Each slot admission hands out goes to the first tenant
in the order above that can use it, and ``B`` can use any: so a slot handed to another tenant
``X`` while ``B`` waits goes to an ``X`` served less recently than ``B`` (or never served, with
an older queued run when ``B`` was never served either), and makes ``X`` the most recently
served, behind ``B`` until ``B`` is served. No other tenant takes two slots while ``B`` waits:
``B`` takes one of the next ``K + 1`` slots handed out, ``K`` the number of other tenants that
queue runs while ``B`` waits and were served less recently than ``B`` (at most the number of
other tenants, whatever their queues hold). Counted in slot releases: ``B`` waits for at most
``K + 1`` of them, and a run of ``B`` with ``j`` runs of ``B`` ahead of it in ``B``'s own
order for at most ``(j + 1) * (K + 1)``; FIFO alone makes it wait for every run queued before
it (a flooding tenant's whole queue). Slots taken by :meth:`Engine.lease
<llamapy.engine.engine.Engine.lease>` (sessions) are outside this count, and the bound assumes
at most :data:`MAX_REMEMBERED` tenants.

**The bound on slots** (``tenant_max_slots`` > 0, :meth:`Admission.capped
<llamapy.engine.admission.Admission.capped>`). A tenant whose runs hold that many slots (not
leased) has its other runs wait even while a slot is idle: with ``n_parallel`` slots and a cap
below it, a tenant arriving while another floods finds an idle slot at once instead of waiting
for a release (the round robin above then bounds its later runs). The cost is idle slots while
only one tenant has work.

**The bound on requests** (:meth:`Tenants.check`). With ``tenant_max_requests`` > 0, a tenant
holding that many queued or running requests has its next one refused with
:class:`~llamapy.errors.TenantBusyError` (a 429 for that tenant alone), before anything of the
request is kept.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator

from llamapy.engine.options import EngineConfig
from llamapy.engine.request import Request, Run
from llamapy.engine.slots import Slot
from llamapy.engine.stats import Counters
from llamapy.errors import TenantBusyError

__all__ = ["Tenants", "tenant_of"]

#: Tenants whose last service is remembered; past it the least recently served are forgotten
#: (they were behind no one still remembered, and stay so: a forgotten tenant counts as never
#: served).
MAX_REMEMBERED = 4096


def tenant_of(run: Run) -> str | None:
    """The tenant of ``run`` (None: the default tenant)."""
    return run.request.options.tenant


class Tenants:
    """Per-tenant bookkeeping of one engine: active runs (for the bound) and the last service
    of each tenant (for the admission order). See the module docstring."""

    def __init__(self, max_requests: int = 0, counters: Counters | None = None, *,
                 max_slots: int = 0) -> None:
        self.max_requests = max_requests
        #: ``tenant_max_slots``: most slots (not leased) one tenant's runs hold (0: all).
        self.max_slots = max_slots
        self.counters = counters or Counters()
        self._active: Counter[str | None] = Counter()
        self._served: dict[str | None, int] = {}
        self._clock = 0

    @classmethod
    def of(cls, config: EngineConfig, counters: Counters) -> Tenants:
        """The bookkeeping of an engine configured by ``config``."""
        return cls(config.tenant_max_requests, counters, max_slots=config.tenant_max_slots)

    def check(self, request: Request) -> None:
        """``TenantBusyError`` (counted as rejected) if ``request``'s tenant may not hold one
        more request."""
        if self.max_requests > 0 and self._active[request.options.tenant] >= self.max_requests:
            self.counters.num_rejected += 1
            raise TenantBusyError(request.options.tenant, self.max_requests)

    def added(self, run: Run) -> None:
        """``run`` was accepted (queued or placed)."""
        self._active[tenant_of(run)] += 1

    def removed(self, run: Run) -> None:
        """``run`` finished."""
        tenant = tenant_of(run)
        self._active[tenant] -= 1
        if self._active[tenant] <= 0:
            del self._active[tenant]

    def granted(self, run: Run, slot: Slot) -> None:
        """``run`` took ``slot``: unless the slot is leased, its tenant is now the most
        recently served."""
        if slot.lease_id is not None:
            return
        self._clock += 1
        tenant = tenant_of(run)
        self._served.pop(tenant, None)
        self._served[tenant] = self._clock  # (insertion order: least recently served first)
        if len(self._served) > MAX_REMEMBERED:
            for forgotten in list(self._served)[: MAX_REMEMBERED // 2]:
                del self._served[forgotten]

    def active(self) -> dict[str | None, int]:
        """Queued plus running requests by tenant (tenants holding none are absent)."""
        return dict(self._active)

    def last_served(self, tenant: str | None) -> int:
        """When ``tenant`` last took a slot that is not leased (a count; 0: never)."""
        return self._served.get(tenant, 0)

    def interleave(self, runs: Iterable[Run]) -> Iterator[Run]:
        """``runs`` (each tenant's in its own order) in the order they are offered slots; the
        caller places each run it is given before asking for the next one (a run placed on a
        slot that is not leased ends its tenant's turn)."""
        groups: dict[str | None, deque[Run]] = {}
        for run in runs:
            groups.setdefault(tenant_of(run), deque()).append(run)
        if len(groups) < 2:
            for group in groups.values():
                yield from group
            return
        turn = deque(sorted(groups, key=lambda t: (self.last_served(t),
                                                    min(r.serial for r in groups[t]))))
        while turn:
            group = groups[turn[0]]
            run = group.popleft()
            yield run
            if not group:
                turn.popleft()
            elif run.slot is not None and run.slot.lease_id is None:
                turn.rotate(-1)  # served: behind every other tenant

    def check_integrity(self, runs: Iterable[Run]) -> None:
        """Raise ``AssertionError`` unless the active counts are those of ``runs`` and no
        tenant is over its bounds."""
        counts = Counter(tenant_of(r) for r in runs)
        if counts != self._active:
            raise AssertionError(f"tenants: active counts {dict(self._active)} != "
                                 f"{dict(counts)}")
        if self.max_requests > 0 and any(n > self.max_requests for n in counts.values()):
            raise AssertionError(f"tenants: a tenant over tenant_max_requests: {dict(counts)}")
        held = Counter(tenant_of(r) for r in runs
                       if r.slot is not None and r.slot.lease_id is None)
        if self.max_slots > 0 and any(n > self.max_slots for n in held.values()):
            raise AssertionError(f"tenants: a tenant over tenant_max_slots: {dict(held)}")
