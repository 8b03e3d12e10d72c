"""Donor slots and in-flight dedup: what other slots hold of a prompt.

:func:`best_donor` finds the slot (other than the run's own) under the run's key that shares
the longest prefix with its prompt; on a backend that cannot cut a sequence back, only as far
as that slot's newest checkpoint within the shared part (its ``rewinder`` says how far).

:func:`follow` runs every tick for a prefilling run: it adopts whatever another slot has
computed of the run's prompt since the run last looked (a metadata-only ``seq_cp`` of the
cells), and tells the run to wait this tick while a slot admitted before it is still computing
a shared part of at least ``tuning.follow_min_tokens``: a wave of requests with one long shared
prefix computes it once. It needs a unified KV that can be trimmed (``resolver.can_share``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamapy.engine.cache.ram import common_prefix
from llamapy.engine.media import media_floor
from llamapy.engine.request import Run
from llamapy.engine.slots import Slot, SlotPool
from llamapy.engine.states import SlotState

if TYPE_CHECKING:
    from llamapy.engine.cache.resolver import PrefixResolver
    from llamapy.engine.cache.rewind import Rewinder

__all__ = ["best_donor", "follow"]


def best_donor(pool: SlotPool, run: Run, slot: Slot, floor: int = 0,
               rewinder: Rewinder | None = None) -> tuple[Slot | None, int]:
    """The other slot sharing the most of ``run``'s prompt (more than ``floor`` tokens) and
    how much; with ``rewinder``, as far as that slot can be rewound."""
    best, best_n = None, floor
    for other in pool.slots:
        if other is slot or other.key != run.key or len(other.cached) <= best_n:
            continue
        n = min(common_prefix(other.cached, run.prompt), run.reuse_cap)
        if rewinder is not None:
            n = rewinder.reach(other.cached, other.checkpoints, n)
        if n > best_n:
            best, best_n = other, n
    return best, best_n


def follow(resolver: PrefixResolver, run: Run) -> bool:
    """Adopt what other slots computed of ``run``'s prompt; True if ``run`` should wait this
    tick for a slot that is computing more of it."""
    slot = run.slot
    if slot is None or not (resolver.tuning.inflight_dedup and resolver.can_share
                            and run.cache_prompt):
        return False
    have = len(slot.cached)
    if have >= run.reuse_cap:
        return False
    donor, n = best_donor(resolver.pool, run, slot, floor=have)
    n = media_floor(run.request.media, n)
    if donor is not None and n > have:
        resolver.backend.seq_cp(donor.seq_id, slot.seq_id, have, n)
        slot.cached.extend(run.prompt[have:n])
        resolver.counters.reused["inflight"] += n - have
        run.timings.inflight_tokens += n - have
        have = n
    return _leader_ahead(resolver.pool, run, slot, have, resolver.tuning.follow_min_tokens)


def _leader_ahead(pool: SlotPool, run: Run, slot: Slot, have: int, min_tokens: int) -> bool:
    for other in pool.slots:
        lead = other.run
        if lead is None or other is slot or other.state is not SlotState.PREFILLING:
            continue
        if other.key != run.key or len(other.cached) != have or lead.serial > run.serial:
            continue
        shared = min(common_prefix(lead.prompt, run.prompt), run.reuse_cap)
        if shared - have >= min_tokens:
            return True
    return False
