"""Writing a request's ``cache_pins`` to the RAM prompt cache as its prefill reaches them.

When a run is resolved, its pins are planned (:func:`plan_pins`): each length is cut to the
prompt, pins shorter than the cache's ``min_tokens`` are dropped (as the cache drops such
entries), one pin per length is kept (the longest time to live) and they are ordered shortest
first. The planner ends prefill chunks at the next pin still to write
(:meth:`~llamapy.engine.request.Run.chunk_to_pin`), so after the chunk the slot holds exactly
the pinned prefix and its state serialises to an entry of that prefix alone. For the same
reason the reuse stops at the first pinned prefix the cache does not hold exactly
(:func:`reuse_for_pins`: the tokens past it are computed again, once per time to live, so
that other conversations sharing only that prefix can restore it, which a much longer entry
would not allow). After the reuse is applied and after each prefill chunk, :func:`write_pins`
pins each prefix the slot now holds
(:meth:`~llamapy.engine.cache.ram.PromptCache.pin`).

With the disk cache on, a prefix pinned in RAM is also filed on disk as last used at its
deadline (wall clock: files outlive the process), so disk eviction takes it after every
unpinned file and a restarted server still finds it
(:meth:`~llamapy.engine.cache.disk.DiskPromptCache.pin`).

``timings.pinned_tokens`` counts the prompt tokens the request computed itself and wrote as
part of a pinned prefix: the longest prefix it wrote as a new entry (pinned, or stored as an
ordinary entry over the pin budget) less the tokens it reused. A prefix pinned already only has
its time to live refreshed, and one the cache held already is pinned where it is: neither
counts.
"""

from __future__ import annotations

import time

from llamapy.engine.backend import Backend
from llamapy.engine.cache.disk import DiskPromptCache
from llamapy.engine.cache.pin_table import PinOutcome
from llamapy.engine.cache.ram import PromptCache
from llamapy.engine.request import Run
from llamapy.engine.slots import Slot

__all__ = ["plan_pins", "reuse_for_pins", "write_pins"]


def plan_pins(run: Run, ram: PromptCache) -> list[tuple[int, float]]:
    """The pins of ``run`` to write, shortest first (none with the RAM cache off or for
    ``cache_prompt=False``)."""
    if not (ram.enabled and run.cache_prompt):
        return []
    ttls: dict[int, float] = {}
    for length, ttl_s in run.request.options.cache_pins:
        length = min(length, len(run.prompt))
        if length >= ram.min_tokens:
            ttls[length] = max(ttl_s, ttls.get(length, 0.0))
    return sorted(ttls.items())


def reuse_for_pins(run: Run, ram: PromptCache, n: int) -> int:
    """``n`` reused tokens, cut to the first of ``run``'s pins below ``n`` that the cache does
    not hold exactly yet."""
    for length, _ in run.pins:
        if length >= n:
            break
        if not ram.holds_exactly(run.key, run.prompt[:length]):
            return length
    return n


def write_pins(run: Run, slot: Slot, ram: PromptCache, disk: DiskPromptCache,
               backend: Backend) -> None:
    """Pin every prefix of ``run`` that ``slot`` now holds whole (in RAM, and on disk)."""
    held = len(slot.cached)
    seq = slot.seq_id
    while run.pins and run.pins[0][0] <= held:
        length, ttl_s = run.pins.pop(0)
        outcome = ram.pin(slot.key, slot.cached, length, ttl_s,
                          lambda: backend.state_seq_size(seq), lambda: backend.state_seq_get(seq))
        if outcome.written:
            timings = run.timings
            timings.pinned_tokens = max(timings.pinned_tokens, length - timings.reused_tokens)
        if outcome in _LIVE and disk.enabled:
            entry = ram.pinned_entry(slot.key, slot.cached[:length])
            if entry is not None:
                disk.pin(entry, time.time_ns() + int(ttl_s * 1e9))


#: Outcomes after which the RAM cache holds the prefix pinned.
_LIVE = (PinOutcome.PINNED, PinOutcome.WRITTEN, PinOutcome.REFRESHED)
