"""The idle bound of a lease: a leased slot nobody uses for its bound goes back to the pool.

A lease (:meth:`Engine.lease <llamapy.engine.engine.Engine.lease>`) pins a slot to one holder
until it is released. A holder that never releases (a session dropped before its finalizer
ran, or kept but forgotten) would hold that slot for good, and on a one-slot server every
other request would wait forever. So a lease may carry a bound, ``idle_s``: the policy is

    a lease is *used* when a request on it is routed or ends, and when a KV operation names it
    (every such use goes through :meth:`SlotPool.leased_slot
    <llamapy.engine.slots.SlotPool.leased_slot>`); it is *idle* while its slot is ``LEASED``
    (no run on it) and no queued request names it; an idle lease whose last use is ``idle_s``
    seconds old is released as :meth:`Engine.release <llamapy.engine.engine.Engine.release>`
    does (its KV stays a cached prefix in its scope) and its holder's ``on_expire`` is called.

A lease with a run on it is never idle, however long the run. The owner of the engine calls
:func:`reclaim_idle_leases` between ticks and wakes for :func:`lease_expiry_wait`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llamapy.engine.engine import Engine
    from llamapy.engine.slots import SlotPool

__all__ = ["LeaseIdle", "lease_expiry_wait", "reclaim_idle_leases", "release_if_held"]

log = logging.getLogger("llamapy.engine")


@dataclass(slots=True)
class LeaseIdle:
    """The idle bound of one lease: ``idle_s`` seconds after ``used_at`` (the engine's clock)
    it may be reclaimed; ``on_expire`` is then called on the engine's thread."""

    idle_s: float
    used_at: float
    on_expire: Callable[[], None] | None = None

    @property
    def expires_at(self) -> float:
        """When the lease expires unless it is used before."""
        return self.used_at + self.idle_s


def overdue(pool: SlotPool, now: float) -> list[tuple[int, LeaseIdle]]:
    """The leases whose slot is free and whose bound has passed, with their bounds."""
    out = []
    for slot in pool.slots:
        bound = slot.lease_idle
        if bound is not None and slot.lease_id is not None and slot.is_free \
                and now >= bound.expires_at:
            out.append((slot.lease_id, bound))
    return out


def reclaim_idle_leases(engine: Engine) -> list[int]:
    """Release every lease idle past its bound (see the module); their ids, in slot order."""
    due = overdue(engine.pool, engine.clock())
    if not due:
        return []
    queued = {run.request.lease_id for run in engine.queue}
    reclaimed = []
    for lease_id, bound in due:
        if lease_id in queued:
            continue
        engine.release(lease_id)
        reclaimed.append(lease_id)
        log.info("lease %d reclaimed after %.0f s idle", lease_id, bound.idle_s)
        if bound.on_expire is not None:
            try:
                bound.on_expire()
            except Exception:  # a holder's bug must not break the engine's thread
                log.exception("on_expire of lease %d raised", lease_id)
    return reclaimed


def lease_expiry_wait(engine: Engine) -> float | None:
    """Seconds until a lease may expire (0 when one may now); None without bounds."""
    times = [slot.lease_idle.expires_at for slot in engine.pool.slots
             if slot.lease_idle is not None]
    return max(0.0, min(times) - engine.clock()) if times else None


def release_if_held(engine: Engine, lease_id: int) -> None:
    """:meth:`Engine.release <llamapy.engine.engine.Engine.release>` unless the lease is gone
    (released or reclaimed already): for a holder that cannot know."""
    if lease_id in engine.pool.leases:
        engine.release(lease_id)
