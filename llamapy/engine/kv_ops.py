"""KV operations on a slot between requests: one type for idle slots and for leased slots.

The engine owns every KV mutation, so these run on its owner thread and only on a slot no
request runs on. :class:`KvOps` comes in two views, told apart by how a slot is named:

- ``Engine.slot_ops`` (llama-server's ``/slots`` actions): a slot by its id, acted on only while
  it is idle (not running a request, not leased), else :class:`~llamapy.errors.SlotBusyError`;
- ``Engine.leases`` (a workspace session's KV): a leased slot by its lease id
  (:meth:`Engine.lease <llamapy.engine.engine.Engine.lease>` pins one slot to one holder: never
  routed to other requests, purged or evicted until released), acted on only while no request
  runs on the lease, else :class:`~llamapy.errors.InvalidOptionError`.

The operations:

- :meth:`~KvOps.tokens`: the tokens whose KV is resident;
- :meth:`~KvOps.save` / :meth:`~KvOps.restore`: the sequence's state as bytes with its tokens
  and cache key (a :class:`KvState`), and back. A restored slot holds exactly the saved tokens
  under the saved key (its ``cache_scope`` included: restoring never lets one tenant's KV serve
  another), or under its own key with a new ``cache_identity``; a restore the backend refuses
  (no room, bytes of another model or context, a token count that does not match) leaves the
  slot empty, never half-filled;
- :meth:`~KvOps.clear`: drop the KV (nothing offered to the cache tiers), optionally re-filing
  the slot under a new cache identity;
- :meth:`~KvOps.next_token_logits`: the logits after a resident sequence (its last token is
  recomputed; the KV ends as it began);
- :meth:`~KvOps.holder`: whose KV a slot holds, in any state.

Every operation keeps ``slot.cached`` exact (the slot invariant), so the engine's reuse paths
stay correct whatever the holder does.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from llamapy.engine.backend import Backend, BatchPlan, Segment
from llamapy.engine.cache.resolver import PrefixResolver
from llamapy.engine.request import CacheKey
from llamapy.engine.slots import Slot, SlotPool
from llamapy.errors import InvalidOptionError, SlotBusyError, UnsupportedFeatureError

__all__ = ["KvOps", "KvState"]

_NO_KEY = CacheKey()


@dataclass(frozen=True, slots=True)
class KvState:
    """A sequence's KV as bytes (``state``), the tokens it holds and the key they are filed
    under."""

    state: bytes
    token_ids: tuple[int, ...]
    key: CacheKey = _NO_KEY


class KvOps:
    """KV operations on idle slots (``leased=False``: named by slot id) or on leased slots
    (``leased=True``: named by lease id); see the module docstring."""

    def __init__(self, backend: Backend, pool: SlotPool, prefix: PrefixResolver, *,
                 leased: bool) -> None:
        self._backend = backend
        self._pool = pool
        self._prefix = prefix
        self._leased = leased

    def tokens(self, ref: int) -> list[int]:
        """Tokens whose KV is resident in the slot."""
        return list(self._find(ref).cached)

    def holder(self, ref: int) -> tuple[str | None, int]:
        """The tenant the slot's KV is filed under and the tokens it holds (any state), for a
        caller that acts on the slot only if it is that tenant's or empty."""
        slot = self._find(ref)
        return (slot.key.tenant if slot.key else None), len(slot.cached)

    def save(self, ref: int) -> KvState:
        """The slot's state, tokens and key."""
        slot = self._free(ref, "save")
        return KvState(self._backend.state_seq_get(slot.seq_id), tuple(slot.cached),
                       slot.key or CacheKey())

    def restore(self, ref: int, saved: KvState, *, cache_identity: str | None = None) -> bool:
        """Replace the slot's KV with ``saved``, filed under ``saved.key`` (with
        ``cache_identity``: under the slot's own key with that identity). False when the
        backend cannot restore it: the slot is then empty, under the new key."""
        slot = self._free(ref, "restore")
        self._prefix.trim(slot, 0)
        if cache_identity is None:
            slot.key = saved.key
        else:
            self._refile(slot, cache_identity)
        self._pool.touch(slot)
        return self._prefix.load(slot, saved.state, saved.token_ids)

    def clear(self, ref: int, cache_identity: str | None = None) -> int:
        """Drop the slot's KV (nothing offered to the cache tiers) and, if given, re-file the
        slot under ``cache_identity``; the number of tokens it held."""
        slot = self._free(ref, "clear")
        n = len(slot.cached)
        self._prefix.trim(slot, 0)
        if cache_identity is not None:
            self._refile(slot, cache_identity)
        return n

    def next_token_logits(self, ref: int, token_ids: Sequence[int]) -> Sequence[float]:
        """Logits after ``token_ids`` (the resident tokens, or those plus one sampled token
        whose KV is not written yet): the last token is (re)computed alone, then the KV holds
        exactly ``token_ids``; returns a copy of the backend's row.
        ``UnsupportedFeatureError`` on a backend without partial removal."""
        slot = self._free(ref, "next_token_logits")
        n, cached = len(token_ids), slot.cached
        if n == 0 or list(token_ids[:len(cached)]) != cached[:n] or n - len(cached) > 1:
            raise InvalidOptionError("next_token_logits: tokens do not extend the slot's KV",
                                     option="token_ids")
        if not self._backend.supports_partial_removal:
            raise UnsupportedFeatureError("next_token_logits", "the backend cannot remove "
                                          "the last position of a sequence")
        self._prefix.trim(slot, n - 1)
        key = slot.key or CacheKey()
        plan = BatchPlan([Segment(slot.seq_id, n - 1, [token_ids[-1]], True, key)],
                         adapter_set=key.adapter_set)
        try:
            self._backend.decode(plan)
        except BaseException:
            self._prefix.resync(slot)
            raise
        slot.cached.append(int(token_ids[-1]))
        return copy.copy(self._backend.logits(0))

    def _find(self, ref: int) -> Slot:
        if self._leased:
            return self._pool.leased_slot(ref)
        slots = self._pool.slots
        if not isinstance(ref, int) or not 0 <= ref < len(slots):
            raise InvalidOptionError(f"invalid slot id {ref!r} (the server has {len(slots)} "
                                     "slots)", option="id_slot")
        return slots[ref]

    def _free(self, ref: int, what: str) -> Slot:
        """The slot, if no request runs on it (and, for a slot id, it is not leased)."""
        slot = self._find(ref)
        if self._leased and not slot.is_free:
            raise InvalidOptionError(f"{what}: a request is running on the lease",
                                     option="lease_id")
        if not self._leased and not slot.is_idle:
            raise SlotBusyError(ref)
        return slot

    @staticmethod
    def _refile(slot: Slot, cache_identity: str) -> None:
        key = slot.key or CacheKey()
        slot.key = key._replace(cache_identity=cache_identity)
