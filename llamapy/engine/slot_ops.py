"""Saving, restoring and erasing an idle slot's KV (llama-server's ``/slots`` actions).

The engine owns every KV mutation, so these run on its owner thread (``Server.call``) and only
on an idle slot (not running a request, not leased): a busy slot raises
:class:`~llamapy.errors.SlotBusyError`. A restored slot holds exactly the saved tokens under the
saved cache key (its ``cache_scope`` included: restoring never lets one tenant's KV serve
another) and is routed to like any slot that computed them; a restore the backend refuses (no
room, bytes of another model or context) leaves the slot empty and raises
:class:`~llamapy.errors.InvalidOptionError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamapy.engine.backend import Backend
from llamapy.engine.cache.resolver import PrefixResolver
from llamapy.engine.request import CacheKey
from llamapy.engine.slots import Slot, SlotPool
from llamapy.errors import InvalidOptionError, SlotBusyError

__all__ = ["SlotOps", "SlotSnapshot"]


@dataclass(frozen=True, slots=True)
class SlotSnapshot:
    """One slot's KV as bytes, the tokens it holds and the key they are filed under."""

    state: bytes
    token_ids: tuple[int, ...]
    key: CacheKey


class SlotOps:
    """KV operations on idle slots (see the module docstring)."""

    def __init__(self, backend: Backend, pool: SlotPool, prefix: PrefixResolver) -> None:
        self._backend = backend
        self._pool = pool
        self._prefix = prefix

    def save(self, slot_id: int) -> SlotSnapshot:
        """The slot's state, tokens and key (``SlotBusyError`` unless it is idle)."""
        slot = self._idle(slot_id)
        return SlotSnapshot(self._backend.state_seq_get(slot.seq_id), tuple(slot.cached),
                         slot.key or CacheKey())

    def restore(self, slot_id: int, saved: SlotSnapshot) -> int:
        """Replace the slot's KV with ``saved``; the number of tokens restored."""
        slot = self._idle(slot_id)
        self._prefix.trim(slot, 0)
        slot.key = saved.key
        if not self._prefix.load(slot, saved.state, saved.token_ids):
            raise InvalidOptionError(f"slot {slot_id}: the saved state does not fit this model "
                                     "and context (or it is corrupt)", option="filename")
        self._pool.touch(slot)
        return len(slot.cached)

    def erase(self, slot_id: int) -> int:
        """Drop the slot's KV (nothing offered to the RAM cache); the tokens it held."""
        slot = self._idle(slot_id)
        n = len(slot.cached)
        self._prefix.trim(slot, 0)
        return n

    def holder(self, slot_id: int) -> tuple[str | None, int]:
        """The tenant the slot's KV is filed under and the tokens it holds (any state), for a
        caller that acts on the slot only if it is that tenant's or empty."""
        slot = self._slot(slot_id)
        return (slot.key.tenant if slot.key else None), len(slot.cached)

    def _slot(self, slot_id: int) -> Slot:
        if not isinstance(slot_id, int) or not 0 <= slot_id < len(self._pool.slots):
            raise InvalidOptionError(f"invalid slot id {slot_id!r} (the server has "
                                     f"{len(self._pool.slots)} slots)", option="id_slot")
        return self._pool.slots[slot_id]

    def _idle(self, slot_id: int) -> Slot:
        slot = self._slot(slot_id)
        if not slot.is_idle:
            raise SlotBusyError(slot_id)
        return slot
