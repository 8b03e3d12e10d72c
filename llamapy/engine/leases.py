"""Leased slots: the KV operations a workspace session needs, owned by the engine.

A lease (:meth:`Engine.lease <llamapy.engine.engine.Engine.lease>`) pins one slot to one
holder: it is never routed to other requests, purged or evicted until released. Requests on the
lease compute its KV in the normal tick; between them the holder may only touch the slot's KV
through :class:`LeaseOps`, on the engine's owner thread, while no request runs on the lease:

- :meth:`~LeaseOps.tokens`: the tokens whose KV is resident;
- :meth:`~LeaseOps.snapshot` / :meth:`~LeaseOps.restore`: the sequence's state as bytes, and
  back (a failed restore leaves the slot empty, never half-filled);
- :meth:`~LeaseOps.clear`: drop the KV and re-file the slot under a new cache identity;
- :meth:`~LeaseOps.next_token_logits`: the logits after a resident sequence (its last token is
  recomputed; the KV ends as it began).

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
from llamapy.errors import InvalidOptionError, UnsupportedFeatureError

__all__ = ["LeaseOps", "LeaseState"]


@dataclass(frozen=True, slots=True)
class LeaseState:
    """A leased sequence's KV as bytes (``state``) and the tokens it holds."""

    state: bytes
    token_ids: tuple[int, ...]


class LeaseOps:
    """KV operations on leased slots (see the module docstring)."""

    def __init__(self, backend: Backend, pool: SlotPool, prefix: PrefixResolver) -> None:
        self._backend = backend
        self._pool = pool
        self._prefix = prefix

    def tokens(self, lease_id: int) -> list[int]:
        """Tokens whose KV is resident in the leased slot."""
        return list(self._pool.leased_slot(lease_id).cached)

    def snapshot(self, lease_id: int) -> LeaseState:
        """The leased sequence's state and tokens."""
        slot = self._free_slot(lease_id, "snapshot")
        return LeaseState(self._backend.state_seq_get(slot.seq_id), tuple(slot.cached))

    def restore(self, lease_id: int, state: LeaseState, cache_identity: str) -> bool:
        """Replace the leased slot's KV with ``state`` and file it under ``cache_identity``.

        False when the backend cannot restore it (no room, corrupt bytes, a token count that
        does not match): the slot is then empty, under the new identity.
        """
        slot = self._free_slot(lease_id, "restore")
        self._prefix.trim(slot, 0)
        self._refile(slot, cache_identity)
        return self._prefix.load(slot, state.state, state.token_ids)

    def clear(self, lease_id: int, cache_identity: str | None = None) -> None:
        """Drop the leased slot's KV (nothing offered to the RAM cache) and, if given, re-file
        the slot under ``cache_identity``."""
        slot = self._free_slot(lease_id, "clear")
        self._prefix.trim(slot, 0)
        if cache_identity is not None:
            self._refile(slot, cache_identity)

    def next_token_logits(self, lease_id: int, token_ids: Sequence[int]) -> Sequence[float]:
        """Logits after ``token_ids`` (the resident tokens, or those plus one sampled token
        whose KV is not written yet): the last token is (re)computed alone, then the KV holds
        exactly ``token_ids``; returns a copy of the backend's row.
        ``UnsupportedFeatureError`` on a backend without partial removal."""
        slot = self._free_slot(lease_id, "next_token_logits")
        n = len(token_ids)
        cached = slot.cached
        if n == 0 or list(token_ids[:len(cached)]) != cached[:n] or n - len(cached) > 1:
            raise InvalidOptionError("next_token_logits: tokens do not extend the lease's KV",
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

    def _free_slot(self, lease_id: int, what: str) -> Slot:
        slot = self._pool.leased_slot(lease_id)
        if not slot.is_free:
            raise InvalidOptionError(f"{what}: a request is running on the lease",
                                     option="lease_id")
        return slot

    @staticmethod
    def _refile(slot: Slot, cache_identity: str) -> None:
        key = slot.key or CacheKey()
        slot.key = key._replace(cache_identity=cache_identity)
