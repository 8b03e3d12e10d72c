"""The RAM prompt cache: byte budget, LRU (not FIFO), coverage, lookup threshold."""

from __future__ import annotations

import pytest

from llamapy.engine.ram_cache import PromptCache

K = ("scope", "")


def data(n: int) -> bytes:
    return b"x" * n


def test_disabled_with_zero_budget():
    cache = PromptCache(0, min_tokens=1)
    assert not cache.enabled
    assert not cache.offer(K, [1, 2, 3], lambda: data(10))


def test_entries_larger_than_the_budget_are_never_stored():
    cache = PromptCache(100, min_tokens=1)
    calls = []
    assert not cache.offer(K, [1, 2], lambda: calls.append(1) or data(200))
    assert len(cache) == 0 and cache.total_bytes == 0


def test_tiny_prefixes_are_skipped_without_serialising():
    cache = PromptCache(1000, min_tokens=4)
    assert not cache.offer(K, [1, 2, 3], lambda: pytest.fail("serialised a tiny prefix"))


def test_lru_not_fifo():
    cache = PromptCache(3 * (40 + 16), min_tokens=1)
    for first in (1, 2, 3):
        assert cache.offer(K, [first, 9, 9, 9], lambda: data(40))
    entry, n = cache.lookup(K, [1, 9, 9, 9, 5], cap=4)
    assert n == 4
    cache.touch(entry)  # entry 1 is now the most recently used
    cache.offer(K, [4, 9, 9, 9], lambda: data(40))
    assert [e.token_ids[0] for e in cache.entries()] == [3, 1, 4]
    assert cache.num_evictions == 1
    cache.check_integrity()


def test_covered_prefixes_are_skipped_and_extensions_replace():
    cache = PromptCache(10_000, min_tokens=1)
    assert cache.offer(K, [1, 2, 3, 4], lambda: data(10))
    assert not cache.offer(K, [1, 2], lambda: data(5))          # covered by [1, 2, 3, 4]
    assert cache.offer(("other", ""), [1, 2], lambda: data(5))  # other key: not covered
    assert cache.offer(K, [1, 2, 3, 4, 5], lambda: data(12))     # covers and replaces
    assert sorted(e.token_ids for e in cache.entries()) == [(1, 2), (1, 2, 3, 4, 5)]
    cache.check_integrity()


def test_lookup_needs_the_same_key_and_enough_of_the_entry():
    cache = PromptCache(10_000, min_tokens=1, min_fraction=0.5)
    cache.offer(K, [1, 2, 3, 4, 5, 6, 7, 8], lambda: data(10))
    assert cache.lookup(("b", ""), [1, 2, 3, 4, 5], cap=5) == (None, 0)
    assert cache.lookup(K, [1, 2, 3, 9], cap=4) == (None, 0)     # 3 of 8: not worth it
    entry, n = cache.lookup(K, [1, 2, 3, 4, 5, 0], cap=5)
    assert entry is not None and n == 5
    assert cache.lookup(K, [1, 2, 3, 4, 5, 0], cap=5, exact=True) == (None, 0)
    assert cache.lookup(K, [1, 2, 3, 4, 5, 6, 7, 8, 9], cap=8, exact=True)[1] == 8


def test_budget_holds_under_many_offers():
    cache = PromptCache(500, min_tokens=1)
    for i in range(50):
        cache.offer(K, [i, i + 1, i + 2], lambda i=i: data(37 + i % 50))
        assert cache.total_bytes <= 500
        cache.check_integrity()
