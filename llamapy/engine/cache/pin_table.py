"""Pinned prompt-cache entries: prefixes a client asked to keep for a while.

A request may name prefixes of its prompt to keep cached for a time (the ``cache_pins``
request option: Anthropic's ``cache_control`` breakpoints, Responses'
``prompt_cache_retention``). The RAM prompt cache keeps an entry holding such a prefix out of
its least-recently-used eviction until the pin's deadline on the engine clock; a later pin of
the same prefix moves the deadline (a hit refreshes the time to live, as Anthropic's cache
does). An expired pin leaves an ordinary entry, evicted like any other.

Pins are bounded: the pinned entries' bytes stay within ``pin_share`` of the cache's budget,
and each tenant's within ``pin_share`` of its own bound. A pin past the bound is not an error:
its entry is stored (or stays) as an ordinary entry. So at least ``1 - pin_share`` of the
budget always remains for the least-recently-used entries.

:class:`PinTable` is the bookkeeping only; :class:`~llamapy.engine.cache.ram.PromptCache`
owns the entries and asks it whether an entry may be evicted.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["PinOutcome", "PinTable"]

#: A pinned prefix: ``(cache key, token ids)``.
PinKey = tuple[Hashable, tuple[int, ...]]


class PinOutcome(str, Enum):
    """What :meth:`~llamapy.engine.cache.ram.PromptCache.pin` did."""

    REFRESHED = "refreshed"  # the prefix was pinned already: its deadline moved
    PINNED = "pinned"        # an entry the cache held is pinned now
    WRITTEN = "written"      # a new entry is stored and pinned
    STORED = "stored"        # a new entry is stored as an ordinary one (over the pin budget)
    HELD = "held"            # an entry the cache held stays ordinary (over the pin budget)
    NOT_HELD = "not_held"    # the cache does not hold it (off, too short, too large)

    @property
    def written(self) -> bool:
        """Whether the prefix was written to the cache by this pin."""
        return self in (PinOutcome.WRITTEN, PinOutcome.STORED)


@dataclass(slots=True)
class PinTable:
    """Deadlines of pinned entries (by entry id) and the pinned bytes, in all and per tenant."""

    budget_bytes: int
    tenant_budget: int
    clock: Callable[[], float]
    _until: dict[int, float] = field(default_factory=dict)
    _charge: dict[int, tuple[Hashable, int]] = field(default_factory=dict)  # id -> tenant, bytes
    _by_prefix: dict[PinKey, int] = field(default_factory=dict)
    _prefixes: dict[int, list[PinKey]] = field(default_factory=dict)
    _tenant_bytes: dict[Hashable, int] = field(default_factory=dict)
    total_bytes: int = 0

    def __len__(self) -> int:
        return len(self._until)

    def find(self, pin_key: PinKey) -> int | None:
        """The live pinned entry holding ``pin_key``'s prefix, or None."""
        self.expire()
        return self._by_prefix.get(pin_key)

    def is_pinned(self, entry_id: int) -> bool:
        """Whether ``entry_id`` is pinned (call :meth:`expire` first for the current time)."""
        return entry_id in self._until

    def pinned_bytes(self, tenant: Hashable) -> int:
        """Bytes of ``tenant``'s pinned entries."""
        return self._tenant_bytes.get(tenant, 0)

    def fits(self, tenant: Hashable, nbytes: int) -> bool:
        """Whether pinning ``nbytes`` more for ``tenant`` stays within both bounds."""
        return (self.total_bytes + nbytes <= self.budget_bytes
                and self.pinned_bytes(tenant) + nbytes <= self.tenant_budget)

    def pin(self, entry_id: int, pin_key: PinKey, tenant: Hashable, nbytes: int,
            ttl_s: float) -> None:
        """Pin ``entry_id`` (holding ``pin_key``'s prefix) for ``ttl_s`` from now; the caller
        checked :meth:`fits` when it was not pinned yet."""
        until = self.clock() + ttl_s
        if entry_id not in self._until:
            self._charge[entry_id] = (tenant, nbytes)
            self._tenant_bytes[tenant] = self.pinned_bytes(tenant) + nbytes
            self.total_bytes += nbytes
            self._until[entry_id] = until
        self._until[entry_id] = max(self._until[entry_id], until)
        if self._by_prefix.get(pin_key) != entry_id:
            self._by_prefix[pin_key] = entry_id
            self._prefixes.setdefault(entry_id, []).append(pin_key)

    def expire(self) -> None:
        """Unpin every entry whose deadline has passed."""
        now = self.clock()
        for entry_id in [i for i, until in self._until.items() if until <= now]:
            self.unpin(entry_id)

    def unpin(self, entry_id: int) -> None:
        """Forget ``entry_id``'s pins (it expired or left the cache); no-op if unpinned."""
        if self._until.pop(entry_id, None) is None:
            return
        tenant, nbytes = self._charge.pop(entry_id)
        self.total_bytes -= nbytes
        self._tenant_bytes[tenant] -= nbytes
        if not self._tenant_bytes[tenant]:
            del self._tenant_bytes[tenant]
        for pin_key in self._prefixes.pop(entry_id, ()):
            if self._by_prefix.get(pin_key) == entry_id:
                del self._by_prefix[pin_key]

    def clear(self) -> None:
        """Forget every pin."""
        for entry_id in list(self._until):
            self.unpin(entry_id)

    def check(self, entry_bytes: dict[int, tuple[Hashable, int]]) -> None:
        """Raise ``AssertionError`` unless the pins match ``entry_bytes`` (the cache's entries
        as id -> (tenant, bytes)) and stay within their bounds."""
        if any(entry_bytes.get(i) != charge for i, charge in self._charge.items()) \
                or set(self._charge) != set(self._until):
            raise AssertionError("ram cache: a pin names an entry the cache does not hold")
        held: dict[Hashable, int] = {}
        for tenant, nbytes in self._charge.values():
            held[tenant] = held.get(tenant, 0) + nbytes
        if held != self._tenant_bytes or sum(held.values()) != self.total_bytes:
            raise AssertionError("ram cache: the pinned bytes disagree with the pins")
        if self.total_bytes > self.budget_bytes or any(
                n > self.tenant_budget for n in held.values()):
            raise AssertionError(f"ram cache: pins over their budget {self.budget_bytes}")
        if any(i not in self._until for i in self._by_prefix.values()):
            raise AssertionError("ram cache: a pinned prefix names an unpinned entry")
