"""The disk prompt cache's in-memory index: its files and its pending writes, by name, and per
``(identity, scope)`` a :class:`~llamapy.engine.cache.radix.PrefixTrie` of their token ids.

The index also sums the bytes of each tenant's files (the tenant of an entry's header), for
the per-tenant share of the budget.

A lookup runs on the tick thread for every admission while the disk cache is on, and an offer
checks whether an entry already covers its prefix. Comparing the prompt with every file of an
identity costs microseconds a file: a folder of thousands of entries behind one system prompt
stalled every decoding stream for milliseconds a lookup. Through the tries, both walk the
prompt's path once, as the RAM cache does.

The owner (:class:`~llamapy.engine.cache.disk.DiskPromptCache`) holds its mutex around every
call. A rescan hands over the whole new file map; files it kept (the same
:class:`~llamapy.engine.cache.disk_store.StoredFile`) stay indexed as they are, so only new files
are walked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llamapy.engine.cache.checkpoints import positions
from llamapy.engine.cache.disk_store import StoredFile
from llamapy.engine.cache.radix import PrefixTrie
from llamapy.engine.cache.ram import CacheEntry

__all__ = ["DiskIndex", "Found"]

#: A disk cache entry: a file, or an entry still being written.
Found = StoredFile | CacheEntry
_Where = tuple[bytes, str | None]


def resumes_at(found: Found, n: int) -> bool:
    """Whether ``found`` restores exactly its first ``n`` tokens on a backend that cannot cut
    a sequence back: all of it, or a context checkpoint there."""
    if isinstance(found, CacheEntry):
        return len(found.token_ids) == n or n in positions(found.data)
    return len(found.header.token_ids) == n or n in found.checkpoints


class DiskIndex:
    """Files and pending writes, findable by prefix within one identity and scope."""

    def __init__(self) -> None:
        #: Indexed files by name.
        self.files: dict[str, StoredFile] = {}
        #: Their sizes, summed.
        self.total_bytes = 0
        #: Their sizes, summed by tenant (tenants without files are absent).
        self.tenant_bytes: dict[str | None, int] = {}
        #: Entries being written, by file name: (identity, entry).
        self.pending: dict[str, tuple[bytes, CacheEntry]] = {}
        self._tries: dict[_Where, PrefixTrie] = {}
        self._items: dict[int, tuple[_Where, Found]] = {}
        self._item_of: dict[int, int] = {}  # id(found) -> item id
        self._next_id = 0

    def set_files(self, files: dict[str, StoredFile]) -> None:
        """Make (a copy of) ``files`` the indexed files (a rescan's result)."""
        old = self.files
        for name, stored in old.items():
            if files.get(name) is not stored:
                self._unindex(stored)
        for name, stored in files.items():
            if old.get(name) is not stored:
                self._index_file(stored)
        self.files = dict(files)
        self.total_bytes = sum(f.size for f in files.values())
        self.tenant_bytes = {}
        for stored in files.values():
            self._charge(stored, stored.size)

    def add_file(self, stored: StoredFile) -> None:
        """Index ``stored``, in place of an indexed file of its name."""
        old = self.files.get(stored.name)
        if old is not None:
            self.forget(old)
        self.files[stored.name] = stored
        self.total_bytes += stored.size
        self._charge(stored, stored.size)
        self._index_file(stored)

    def forget(self, stored: StoredFile) -> None:
        """Drop ``stored`` if it is still the indexed file of its name."""
        if self.files.get(stored.name) is stored:
            del self.files[stored.name]
            self.total_bytes -= stored.size
            self._charge(stored, -stored.size)
            self._unindex(stored)

    def add_pending(self, name: str, identity: bytes, entry: CacheEntry) -> None:
        """Index ``entry``, about to be written to ``name``."""
        self.pop_pending(name)
        self.pending[name] = (identity, entry)
        scope = getattr(entry.key, "cache_scope", None)
        self._index((identity, scope), entry.token_ids, entry)

    def pop_pending(self, name: str) -> None:
        """Drop the pending entry of ``name`` (written, or given up)."""
        got = self.pending.pop(name, None)
        if got is not None:
            self._unindex(got[1])

    def best(self, identity: bytes, scope: str | None, prompt: tuple[int, ...],
             usable: Callable[[int, int], bool]) -> tuple[Found | None, int]:
        """The entry sharing the longest usable prefix with ``prompt``, and that length
        (:meth:`PrefixTrie.best`); ``(None, 0)`` if none."""
        trie = self._tries.get((identity, scope))
        if trie is None:
            return None, 0
        item_id, n = trie.best(prompt, usable)
        return (None, 0) if item_id is None else (self._items[item_id][1], n)

    def covers(self, identity: bytes, scope: str | None, tokens: Sequence[int], *,
               resume_points: bool = False) -> bool:
        """Whether an entry of ``identity`` and ``scope`` holds ``tokens`` or extends them
        (with ``resume_points``: one that resumes exactly there, see :func:`resumes_at`)."""
        trie = self._tries.get((identity, scope))
        if trie is None or not resume_points:
            return trie is not None and trie.extends(tokens)
        return any(resumes_at(self._items[i][1], len(tokens)) for i in trie.extensions(tokens))

    def covered_by(self, name: str, *, resume_points: bool = False) -> list[StoredFile]:
        """The indexed files other than file ``name``, of its identity and scope, whose tokens
        are a prefix of its own (the writer drops them: ``name`` restores all they would;
        with ``resume_points``, only those it resumes exactly, see :func:`resumes_at`)."""
        new = self.files.get(name)
        trie = None if new is None else self._tries.get((new.header.identity, new.header.scope))
        if new is None or trie is None:
            return []
        found = [self._items[i][1] for i in trie.prefixes_of(new.header.token_ids)]
        return [f for f in found if isinstance(f, StoredFile) and f is not new
                and (not resume_points or resumes_at(new, len(f.header.token_ids)))]

    def over(self, budget: int) -> list[StoredFile]:
        """Every indexed file when they exceed ``budget`` bytes together, else none."""
        return list(self.files.values()) if self.total_bytes > budget else []

    def tenants_over(self, budget: int) -> list[list[StoredFile]]:
        """The files of each tenant whose files exceed ``budget`` bytes together."""
        over = {t for t, n in self.tenant_bytes.items() if n > budget}
        groups: dict[str | None, list[StoredFile]] = {t: [] for t in over}
        for stored in self.files.values() if over else ():
            if stored.header.tenant in over:
                groups[stored.header.tenant].append(stored)
        return list(groups.values())

    def check(self, tenant_budget: int | None = None) -> None:
        """Raise ``AssertionError`` unless the tries index exactly the files and pending, and
        each tenant's files hold at most ``tenant_budget`` bytes (if given)."""
        want = {id(f): ((f.header.identity, f.header.scope), f.header.token_ids)
                for f in self.files.values()}
        want |= {id(e): ((i, getattr(e.key, "cache_scope", None)), e.token_ids)
                 for i, e in self.pending.values()}
        have = {id(self._items[i][1]): (where, tokens)
                for where, trie in self._tries.items() for i, tokens, _ in trie.items()}
        if have != want or len(self._items) != len(want) or len(self._item_of) != len(want):
            raise AssertionError("disk cache: the prefix index disagrees with the files")
        held: dict[str | None, int] = {}
        for f in self.files.values():
            held[f.header.tenant] = held.get(f.header.tenant, 0) + f.size
        if {t: n for t, n in held.items() if n} != self.tenant_bytes:
            raise AssertionError("disk cache: the bytes per tenant disagree with the files")
        if tenant_budget is not None and any(n > tenant_budget for n in held.values()):
            raise AssertionError(f"disk cache: a tenant over its budget {tenant_budget}")
        for trie in self._tries.values():
            trie.check()

    def _charge(self, stored: StoredFile, size: int) -> None:
        tenant = stored.header.tenant
        held = self.tenant_bytes.get(tenant, 0) + size
        if held:
            self.tenant_bytes[tenant] = held
        else:
            self.tenant_bytes.pop(tenant, None)

    def _index_file(self, stored: StoredFile) -> None:
        head = stored.header
        self._index((head.identity, head.scope), head.token_ids, stored)

    def _index(self, where: _Where, tokens: tuple[int, ...], found: Found) -> None:
        item_id = self._next_id
        self._next_id += 1
        self._items[item_id] = (where, found)
        self._item_of[id(found)] = item_id
        self._tries.setdefault(where, PrefixTrie()).add(item_id, tokens)

    def _unindex(self, found: Found) -> None:
        item_id = self._item_of.pop(id(found))
        where, _ = self._items.pop(item_id)
        trie = self._tries[where]
        tokens = found.token_ids if isinstance(found, CacheEntry) else found.header.token_ids
        trie.remove(item_id, tokens)
        if not trie.size:
            del self._tries[where]
