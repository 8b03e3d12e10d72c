"""The disk prompt cache's prefix index answers as a scan of every file and pending entry."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.engine.cache.disk import CacheNamespace, DiskPromptCache
from llamapy.engine.cache.disk_format import EntryHeader
from llamapy.engine.cache.disk_index import DiskIndex, Found
from llamapy.engine.cache.disk_store import StoredFile
from llamapy.engine.cache.ram import CacheEntry, common_prefix
from llamapy.engine.request import CacheKey

IDS = (b"model-a", b"model-b")
SCOPES = ("tenant-a", None)
tokens_st = st.lists(st.integers(0, 2), max_size=12).map(tuple)
BASE = tuple(i % 5 for i in range(40))


def tokens_of(found: Found) -> tuple[int, ...]:
    return found.token_ids if isinstance(found, CacheEntry) else found.header.token_ids


def where_of(found: Found, pending_ids: dict[int, bytes]) -> tuple[bytes, str | None]:
    if isinstance(found, CacheEntry):
        return pending_ids[id(found)], found.key.cache_scope
    return found.header.identity, found.header.scope


def scan(everything: list[tuple[tuple[bytes, str | None], Found]], where: tuple,
         prompt: tuple[int, ...], cap: int, frac: float, exact: bool) -> tuple[set[int], int]:
    """The old lookup: every entry of ``where`` compared with the prompt; ties by id."""
    best, tied = 0, set()
    for at, found in everything:
        size = len(tokens_of(found))
        n = min(common_prefix(tokens_of(found), prompt), cap)
        if at != where or (exact and n < size) or n < max(1, frac * size):
            continue
        if n > best:
            best, tied = n, set()
        if n == best:
            tied.add(id(found))
    return tied, best


def stored(name: str, identity: bytes, scope: str | None, tokens: tuple[int, ...]) -> StoredFile:
    header = EntryHeader(identity, scope, tokens, 0, b"", 0)
    return StoredFile(name, header, 0, 0, 0)


@settings(max_examples=300, deadline=None)
@given(frac=st.sampled_from([0.0, 0.5, 1.0]),
       ops=st.lists(st.tuples(st.sampled_from(["file", "drop", "pend", "land", "look"]),
                              st.integers(0, 1), st.integers(0, 1), tokens_st,
                              st.integers(0, 14), st.booleans()), max_size=40))
def test_the_index_answers_as_a_scan(frac: float, ops: list[tuple]) -> None:
    index = DiskIndex()
    pending_ids: dict[int, bytes] = {}
    for step, (op, i, s, tokens, cap, exact) in enumerate(ops):
        ident, scope = IDS[i], SCOPES[s]
        if op == "file":  # a rescan that found one more file (the others kept as they were)
            index.set_files({**index.files, f"f{step}": stored(f"f{step}", ident, scope, tokens)})
        elif op == "drop" and index.files:  # a rescan that lost a file
            names = sorted(index.files)
            index.set_files({n: f for n, f in index.files.items()
                             if n != names[cap % len(names)]})
        elif op == "pend":
            entry = CacheEntry(CacheKey(scope, "", ()), tokens, b"")
            pending_ids[id(entry)] = ident
            index.add_pending(f"p{step}", ident, entry)
        elif op == "land" and index.pending:
            index.pop_pending(sorted(index.pending)[cap % len(index.pending)])
        elif op == "look":
            everything = [*index.files.values(), *(e for _, e in index.pending.values())]
            listed = [(where_of(f, pending_ids), f) for f in everything]
            if step % 2 and listed:  # half the lookups extend an entry of any identity or scope
                tokens = tokens_of(listed[cap % len(listed)][1]) + tokens

            def usable(n: int, size: int, exact: bool = exact) -> bool:
                return n >= max(1, frac * size) and (n >= size or not exact)

            found, n = index.best(ident, scope, tokens[:cap], usable)
            tied, best = scan(listed, (ident, scope), tokens, cap, frac, exact)
            assert n == best
            assert (found is None) if best == 0 else id(found) in tied
            covering = any(w == (ident, scope) and tokens_of(f)[:len(tokens)] == tokens
                           for w, f in listed)
            assert index.covers(ident, scope, tokens) == covering
        index.check()


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["offer", "lookup"]), st.integers(0, 1),
                              st.integers(0, 40), st.lists(st.integers(0, 2), max_size=8),
                              st.integers(0, 40), st.booleans()), max_size=25))
def test_the_disk_cache_finds_what_a_scan_of_its_files_finds(ops: list[tuple]) -> None:
    keys = (CacheKey("tenant-a", "", ()), CacheKey("tenant-b", "", ()))
    with tempfile.TemporaryDirectory() as folder:
        disk = DiskPromptCache(folder, 40_000, namespace=CacheNamespace("m"), min_tokens=4,
                               background=False)  # a small budget: writes evict
        for op, k, cut, tail, cap, exact in ops:  # prompts share a prefix of BASE
            key, tokens = keys[k], [*BASE[:cut], *tail]
            if op == "offer":
                data = bytes(50 * len(tokens))
                disk.offer(key, tokens, lambda d=data: len(d), lambda d=data: d)
            else:
                found, n = disk.lookup(key, tokens, cap, exact=exact)
                listed = [((f.header.identity, f.header.scope), f) for f in disk.files()]
                tied, best = scan(listed, (disk.identity(key), key.cache_scope),
                                  tuple(tokens), cap, disk.min_fraction, exact)
                assert n == best
                assert (found is None) if best == 0 else id(found) in tied
            disk.check_integrity()
        disk.close()
