"""Level-2 prompt cache: serialised sequence state kept in RAM, byte-bounded, LRU.

Contract:

- An entry is ``(cache key, token ids, state bytes)``; it may only be restored for a request
  with the same key (``(cache_scope, cache_identity, adapter_set)``).
- ``offer`` stores a prefix that is about to be destroyed in the KV cache. It skips prefixes
  shorter than ``min_tokens``, prefixes an existing entry already covers, and entries larger
  than the whole budget (a small budget degrades to "disabled", never to OOM). The charge is
  computed from the state's size (``Backend.state_seq_size``) before anything is serialised:
  the state is only serialised for an entry that will be stored. Entries the new one covers
  are dropped; then, while the entry's tenant would hold more than its share of the budget
  (``tenant_share``), that tenant's own least-recently-used entries are evicted; then the
  cache's least-recently-used entries, whoever's, until it fits. So a tenant at its share
  evicts only its own entries, and one below it evicts the oldest (with a share of 1, one
  least-recently-used order for all, as without tenants).
- ``lookup`` finds the entry sharing the longest prefix with a prompt; it is only worth
  restoring when at least ``min_fraction`` of the entry is reusable (the tail is trimmed).
- ``on_evict`` (the level below, the disk cache) receives each entry evicted as least
  recently used; entries dropped because a new one covers them are not passed on.
- ``pin`` keeps a prefix cached for a time (:mod:`llamapy.engine.cache.pin_table`): a pinned entry
  is skipped by least-recently-used eviction and by the drop of covered entries until its
  deadline on ``clock``, within ``pin_share`` of the budget (and of each tenant's bound);
  over that bound the prefix is stored as an ordinary entry. An entry that would only fit by
  evicting pinned ones is not stored.
- ``total_bytes <= budget_bytes`` and each tenant's bytes ``<= tenant_budget`` always;
  ``check_integrity`` verifies the bookkeeping. (An entry's tenant is its key's ``tenant``,
  None for keys without one.)

Entries are indexed per key by a :class:`~llamapy.engine.cache.radix.PrefixTrie` (a radix
tree of their token ids): a lookup, an offer and a cover check walk the prompt's path once and
never look at entries one by one (a full cache holds thousands, often all behind one system
prompt, and the engine looks up every queued request when it orders admissions).
Every entry holds at least ``min_tokens`` tokens and is only restored for at least
``min_fraction`` of them, so a usable entry shares at least ``head = ceil(min_fraction *
min_tokens)`` (at least 1, at most ``min_tokens``) leading tokens with the prompt.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from llamapy.engine.cache.checkpoints import positions
from llamapy.engine.cache.pin_table import PinOutcome, PinTable
from llamapy.engine.cache.radix import PrefixTrie, restorable
from llamapy.engine.cache.tier import ReadStatus
from llamapy.engine.options import EngineConfig, EngineTuning

__all__ = ["CacheEntry", "PromptCache", "charged_bytes", "common_prefix", "open_ram_cache",
           "tenant_budget"]


_BLOCK = 256


def charged_bytes(state_bytes: int, n_tokens: int) -> int:
    """Bytes an entry is charged against the budget: its state plus 4 bytes per token id."""
    return state_bytes + 4 * n_tokens


def tenant_budget(budget_bytes: int, share: float) -> int:
    """The most bytes of a cache of ``budget_bytes`` one tenant may hold at ``share``."""
    return budget_bytes if share >= 1 else int(share * budget_bytes)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences (block-wise slice compares
    run at C speed; only the mismatching block is scanned token by token)."""
    n = min(len(a), len(b))
    i = 0
    while i < n:
        j = min(i + _BLOCK, n)
        if a[i:j] != b[i:j]:  # (also true for a list against a tuple: then scan the block)
            while i < j and a[i] == b[i]:
                i += 1
            if i < j:
                return i
        i = j
    return n


@dataclass(slots=True, frozen=True, eq=False)
class CacheEntry:
    """One serialised prefix."""

    key: Hashable
    token_ids: tuple[int, ...]
    data: bytes

    @property
    def nbytes(self) -> int:
        """Bytes charged against the budget (:func:`charged_bytes`)."""
        return charged_bytes(len(self.data), len(self.token_ids))

    @property
    def tenant(self) -> Hashable:
        """The tenant the entry is charged to: its key's ``tenant`` (None without one)."""
        return tenant_of(self.key)


def tenant_of(key: Hashable) -> Hashable:
    """The tenant a cache key charges: its ``tenant`` (None without one)."""
    return getattr(key, "tenant", None)


def _resumes_at(entry: CacheEntry, n: int) -> bool:
    """Whether ``entry`` restores exactly its first ``n`` tokens on a backend that cannot cut
    a sequence back: all of it, or a context checkpoint packed with it at ``n``."""
    return len(entry.token_ids) == n or n in positions(entry.data)


class PromptCache:
    """A byte-bounded LRU of :class:`CacheEntry`, with a bound per tenant: the RAM
    :class:`~llamapy.engine.cache.tier.CacheTier` (its entries are read at once)."""

    name = "ram"

    def __init__(self, budget_bytes: int, *, min_tokens: int = 32,
                 min_fraction: float = 0.5,
                 on_evict: Callable[[CacheEntry], object] | None = None,
                 tenant_share: float = 1.0, pin_share: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 <= pin_share <= 1.0:
            raise ValueError(f"pin_share must be in [0, 1], got {pin_share!r}")
        self.budget_bytes = budget_bytes
        #: The most bytes one tenant's entries may hold.
        self.tenant_budget = tenant_budget(budget_bytes, tenant_share)
        #: Pinned entries, within ``pin_share`` of the budget and of each tenant's bound.
        self.pins = PinTable(int(pin_share * budget_bytes),
                             int(pin_share * self.tenant_budget), clock)
        self.on_evict = on_evict
        self.min_tokens = min_tokens
        self.min_fraction = min_fraction
        #: An entry covers a shorter prefix only where it can resume exactly (its own end, or
        #: a context checkpoint there): set for a backend that cannot cut a sequence back.
        self.resume_points = False
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()
        self._tries: dict[Hashable, PrefixTrie] = {}  # key -> its entries' ids by prefix
        self._ids: dict[int, int] = {}  # id(entry) -> entry id
        self._tenants: dict[Hashable, OrderedDict[int, None]] = {}  # each tenant's LRU order
        self._tenant_bytes: dict[Hashable, int] = {}
        #: Leading tokens every usable (or covering) entry shares with the prompt.
        self.head = min(min_tokens, max(1, math.ceil(min_fraction * min_tokens)))
        self._next_id = 0
        self.total_bytes = 0
        self.num_evictions = 0
        self.num_stored = 0
        self.num_restores = 0

    @property
    def enabled(self) -> bool:
        """False when the budget is 0."""
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[CacheEntry]:
        """Entries, least recently used first."""
        return list(self._entries.values())

    def tenant_bytes(self) -> dict[Hashable, int]:
        """Bytes held by each tenant (tenants holding none are absent)."""
        return dict(self._tenant_bytes)

    def offer(self, key: Hashable, token_ids: Sequence[int], get_size: Callable[[], int],
              get_data: Callable[[], bytes]) -> bool:
        """Store a prefix about to be destroyed. ``get_size`` returns the length of the bytes
        ``get_data`` would return; it is only called for a long enough, uncovered prefix, and
        ``get_data`` only when the entry fits the budget (and so will be stored). Returns
        whether it was stored."""
        token_ids = tuple(token_ids)
        if not self.enabled or len(token_ids) < self.min_tokens or self._covered(key, token_ids):
            return False
        return self._store(key, token_ids, get_size, get_data) is not None

    def pin(self, key: Hashable, token_ids: Sequence[int], pin_len: int, ttl_s: float,
            get_size: Callable[[], int], get_data: Callable[[], bytes]) -> PinOutcome:
        """Keep the first ``pin_len`` of ``token_ids`` (what a sequence holds now, serialised by
        ``get_size``/``get_data`` as for :meth:`offer`) cached for ``ttl_s`` seconds.

        A prefix pinned already has its deadline moved. Otherwise the entry holding exactly
        the prefix is pinned, else a new entry of ``token_ids`` is stored and pinned, else (the
        sequence holds more than the prefix) the shortest entry holding the prefix is pinned.
        Over the pin budget the entry stays ordinary (``STORED``, ``HELD``)."""
        token_ids = tuple(token_ids)
        prefix = token_ids[:pin_len]
        if not self.enabled or len(prefix) < max(1, self.min_tokens):
            return PinOutcome.NOT_HELD
        pin_key = (key, prefix)
        entry_id = self.pins.find(pin_key)
        if entry_id is not None:
            self.pins.pin(entry_id, pin_key, tenant_of(key), 0, ttl_s)
            self.touch(self._entries[entry_id])
            return PinOutcome.REFRESHED
        entry_id = self._holder(key, prefix)
        exact = entry_id is not None and len(self._entries[entry_id].token_ids) == pin_len
        written = not exact and (entry_id is None or len(token_ids) == pin_len)
        if written:
            stored = self._store(key, token_ids, get_size, get_data)
            entry_id = None if stored is None else self._ids[id(stored)]
        if entry_id is None:
            return PinOutcome.NOT_HELD
        entry = self._entries[entry_id]
        self.touch(entry)
        if not self.pins.is_pinned(entry_id) and not self.pins.fits(entry.tenant, entry.nbytes):
            return PinOutcome.STORED if written else PinOutcome.HELD
        self.pins.pin(entry_id, pin_key, entry.tenant, entry.nbytes, ttl_s)
        return PinOutcome.WRITTEN if written else PinOutcome.PINNED

    def pinned_entry(self, key: Hashable, prefix: Sequence[int]) -> CacheEntry | None:
        """The live pinned entry holding ``prefix`` under ``key`` (pinned for it), or None."""
        entry_id = self.pins.find((key, tuple(prefix)))
        return None if entry_id is None else self._entries[entry_id]

    def holds_exactly(self, key: Hashable, token_ids: Sequence[int]) -> bool:
        """Whether an entry under ``key`` holds exactly ``token_ids``."""
        entry_id = self._holder(key, tuple(token_ids))
        return entry_id is not None and len(self._entries[entry_id].token_ids) == len(token_ids)

    def _holder(self, key: Hashable, prefix: tuple[int, ...]) -> int | None:
        """The shortest entry under ``key`` that holds ``prefix``, or None."""
        trie = self._tries.get(key)
        if trie is None:
            return None
        entry_id, _ = trie.best(prefix, lambda n, _size: n >= len(prefix))
        return entry_id

    def _store(self, key: Hashable, token_ids: tuple[int, ...], get_size: Callable[[], int],
               get_data: Callable[[], bytes]) -> CacheEntry | None:
        """Store an entry if it fits beside the pinned ones, evicting unpinned entries."""
        self.pins.expire()
        tenant = tenant_of(key)
        room = min(self.tenant_budget - self.pins.pinned_bytes(tenant),
                   self.budget_bytes - self.pins.total_bytes)
        if charged_bytes(get_size(), len(token_ids)) > room:
            return None
        entry = CacheEntry(key, token_ids, get_data())
        if entry.nbytes > room:  # the size lied (a broken backend): never overrun
            return None
        self._drop_covered_by(entry)
        while self._tenant_bytes.get(tenant, 0) + entry.nbytes > self.tenant_budget:
            self._evict_lru(self._tenants[tenant])  # (it holds unpinned ones: the entry fits)
        while self.total_bytes + entry.nbytes > self.budget_bytes:
            self._evict_lru(self._entries)
        self._add(entry)
        self.num_stored += 1
        return entry

    def lookup(self, key: Hashable, prompt: Sequence[int], cap: int, *,
               exact: bool = False) -> tuple[CacheEntry | None, int]:
        """The entry with the longest usable prefix of ``prompt`` (at most ``cap`` tokens) and
        that length; ``(None, 0)`` if none is worth restoring. ``exact``: only entries usable
        whole (backends that cannot trim a restored tail)."""
        trie = self._tries.get(key)
        if trie is None or cap < self.head:  # a usable entry reuses at least head tokens
            return None, 0
        entry_id, n = trie.best(tuple(prompt[:cap]), restorable(self.min_fraction, exact))
        return (None, 0) if entry_id is None else (self._entries[entry_id], n)

    def fetch(self, serial: int, entry: CacheEntry) -> tuple[ReadStatus, bytes | None]:
        """``(READY, entry.data)``: RAM entries are read at once."""
        return ReadStatus.READY, entry.data

    def forget(self, serial: int) -> None:
        """Nothing to drop: RAM reads never wait."""

    def wait(self, timeout: float = 0.05) -> None:
        """Returns at once: RAM reads never wait."""

    def token_ids(self, entry: CacheEntry) -> tuple[int, ...]:
        """The tokens ``entry`` holds."""
        return entry.token_ids

    def checkpoint_positions(self, entry: CacheEntry) -> list[int]:
        """The checkpoint positions packed with ``entry``'s state."""
        return positions(entry.data)

    def touch(self, entry: CacheEntry) -> None:
        """Mark ``entry`` most recently used."""
        entry_id = self._ids.get(id(entry))
        if entry_id is None or self._entries.get(entry_id) is not entry:
            return
        self._entries.move_to_end(entry_id)
        self._tenants[entry.tenant].move_to_end(entry_id)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._tries.clear()
        self._ids.clear()
        self._tenants.clear()
        self._tenant_bytes.clear()
        self.pins.clear()
        self.total_bytes = 0

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if the byte accounting or the budget is broken."""
        total = sum(e.nbytes for e in self._entries.values())
        if total != self.total_bytes:
            raise AssertionError(f"ram cache: total_bytes {self.total_bytes} != {total}")
        if total > max(self.budget_bytes, 0):
            raise AssertionError(f"ram cache: {total} bytes over budget {self.budget_bytes}")
        self._check_tenants()
        indexed = {(key, i): tokens for key, trie in self._tries.items()
                   for i, tokens, _ in trie.items()}
        if indexed != {(e.key, i): e.token_ids for i, e in self._entries.items()} \
                or len(self._ids) != len(self._entries):
            raise AssertionError("ram cache: the prefix index disagrees with the entries")
        for trie in self._tries.values():
            trie.check()
        self.pins.check({i: (e.tenant, e.nbytes) for i, e in self._entries.items()})

    def _check_tenants(self) -> None:
        order: dict[Hashable, list[int]] = {}
        held: dict[Hashable, int] = {}
        for entry_id, entry in self._entries.items():
            order.setdefault(entry.tenant, []).append(entry_id)
            held[entry.tenant] = held.get(entry.tenant, 0) + entry.nbytes
        if held != self._tenant_bytes or order != {t: list(o) for t, o in self._tenants.items()}:
            raise AssertionError("ram cache: the per-tenant bookkeeping disagrees")
        if any(n > self.tenant_budget for n in held.values()):
            raise AssertionError(f"ram cache: a tenant over its budget {self.tenant_budget}: "
                                 f"{held}")

    def covers(self, key: Hashable, token_ids: Sequence[int]) -> bool:
        """Whether an entry under ``key`` holds ``token_ids`` (or an extension of them)."""
        return self._covered(key, tuple(token_ids))

    def _covered(self, key: Hashable, token_ids: Sequence[int]) -> bool:
        trie = self._tries.get(key)
        if trie is None or not self.resume_points:
            return trie is not None and trie.extends(token_ids)
        return any(_resumes_at(self._entries[i], len(token_ids))
                   for i in trie.extensions(token_ids))

    def _drop_covered_by(self, entry: CacheEntry) -> None:
        trie = self._tries.get(entry.key)
        for entry_id in trie.prefixes_of(entry.token_ids) if trie else ():
            shorter = len(self._entries[entry_id].token_ids)
            if not self.pins.is_pinned(entry_id) and (
                    not self.resume_points or _resumes_at(entry, shorter)):
                self._remove(entry_id)

    def _evict_lru(self, order: Mapping[int, object]) -> None:
        """Evict the first unpinned entry of ``order`` (the cache's or one tenant's LRU
        order)."""
        entry_id = next(i for i in order if not self.pins.is_pinned(i))
        entry = self._entries[entry_id]
        self._remove(entry_id)
        self.num_evictions += 1
        if self.on_evict is not None:
            self.on_evict(entry)

    def _add(self, entry: CacheEntry) -> None:
        entry_id = self._next_id
        self._next_id += 1
        self._entries[entry_id] = entry
        self._tries.setdefault(entry.key, PrefixTrie()).add(entry_id, entry.token_ids)
        self._ids[id(entry)] = entry_id
        self.total_bytes += entry.nbytes
        self._tenants.setdefault(entry.tenant, OrderedDict())[entry_id] = None
        self._tenant_bytes[entry.tenant] = self._tenant_bytes.get(entry.tenant, 0) + entry.nbytes

    def _remove(self, entry_id: int) -> None:
        self.pins.unpin(entry_id)
        entry = self._entries.pop(entry_id)
        self.total_bytes -= entry.nbytes
        trie = self._tries[entry.key]
        trie.remove(entry_id, entry.token_ids)
        if not trie.size:
            del self._tries[entry.key]
        del self._ids[id(entry)]
        tenant = entry.tenant
        del self._tenants[tenant][entry_id]
        self._tenant_bytes[tenant] -= entry.nbytes
        if not self._tenants[tenant]:
            del self._tenants[tenant], self._tenant_bytes[tenant]


def open_ram_cache(config: EngineConfig, tuning: EngineTuning,
                   on_evict: Callable[[CacheEntry], object], clock: Callable[[], float]
                   ) -> PromptCache:
    """The engine's RAM prompt cache as ``config`` and ``tuning`` size it; its evictions go to
    ``on_evict`` (the disk cache), its pins expire on ``clock``."""
    return PromptCache(config.prompt_cache_ram_bytes, min_tokens=tuning.ram_min_tokens,
                       min_fraction=tuning.ram_min_fraction, on_evict=on_evict,
                       tenant_share=config.tenant_cache_share, pin_share=tuning.ram_pin_share,
                       clock=clock)
