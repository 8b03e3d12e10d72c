"""The RAM prompt cache: byte budget, LRU (not FIFO), coverage, lookup threshold."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.engine.cache.ram import PromptCache

K = ("scope", "")


def data(n: int) -> bytes:
    return b"x" * n


def sized(n: int) -> tuple[Callable[[], int], Callable[[], bytes]]:
    """``(get_size, get_data)`` of an ``n``-byte state."""
    return (lambda: n), (lambda: data(n))


def unserialised(n: int) -> tuple[Callable[[], int], Callable[[], bytes]]:
    """An ``n``-byte state that fails the test if it is serialised."""
    return (lambda: n), (lambda: pytest.fail("serialised an entry that is not stored"))


def test_disabled_with_zero_budget():
    cache = PromptCache(0, min_tokens=1)
    assert not cache.enabled
    assert not cache.offer(K, [1, 2, 3], *sized(10))


def test_entries_larger_than_the_budget_are_never_serialised_or_stored():
    cache = PromptCache(100, min_tokens=1)
    assert not cache.offer(K, [1, 2], *unserialised(93))  # 93 + 4 * 2 = 101 > 100
    assert len(cache) == 0 and cache.total_bytes == 0
    assert cache.offer(K, [1, 2], *sized(92))              # exactly the budget: stored
    assert cache.total_bytes == 100 and cache.entries()[0].data == data(92)


def test_tiny_and_covered_prefixes_are_skipped_without_sizing_or_serialising():
    cache = PromptCache(1000, min_tokens=4)
    untouchable = (lambda: pytest.fail("sized a skipped prefix"),
                   lambda: pytest.fail("serialised a skipped prefix"))
    assert not cache.offer(K, [1, 2, 3], *untouchable)
    assert cache.offer(K, [1, 2, 3, 4, 5], *sized(10))
    assert not cache.offer(K, [1, 2, 3, 4], *untouchable)


def test_a_size_that_understates_the_state_never_overruns_the_budget():
    cache = PromptCache(100, min_tokens=1)
    assert not cache.offer(K, [1, 2], lambda: 10, lambda: data(200))
    assert cache.offer(K, [3, 4], *sized(50))
    assert not cache.offer(K, [5, 6], lambda: 10, lambda: data(200))
    assert [e.token_ids for e in cache.entries()] == [(3, 4)]
    cache.check_integrity()


def test_lru_not_fifo():
    cache = PromptCache(3 * (40 + 16), min_tokens=1)
    for first in (1, 2, 3):
        assert cache.offer(K, [first, 9, 9, 9], *sized(40))
    entry, n = cache.lookup(K, [1, 9, 9, 9, 5], cap=4)
    assert n == 4
    cache.touch(entry)  # entry 1 is now the most recently used
    cache.offer(K, [4, 9, 9, 9], *sized(40))
    assert [e.token_ids[0] for e in cache.entries()] == [3, 1, 4]
    assert cache.num_evictions == 1
    cache.check_integrity()


def test_covered_prefixes_are_skipped_and_extensions_replace():
    cache = PromptCache(10_000, min_tokens=1)
    assert cache.offer(K, [1, 2, 3, 4], *sized(10))
    assert not cache.offer(K, [1, 2], *sized(5))          # covered by [1, 2, 3, 4]
    assert cache.offer(("other", ""), [1, 2], *sized(5))  # other key: not covered
    assert cache.offer(K, [1, 2, 3, 4, 5], *sized(12))     # covers and replaces
    assert sorted(e.token_ids for e in cache.entries()) == [(1, 2), (1, 2, 3, 4, 5)]
    cache.check_integrity()


def test_lookup_needs_the_same_key_and_enough_of_the_entry():
    cache = PromptCache(10_000, min_tokens=1, min_fraction=0.5)
    cache.offer(K, [1, 2, 3, 4, 5, 6, 7, 8], *sized(10))
    assert cache.lookup(("b", ""), [1, 2, 3, 4, 5], cap=5) == (None, 0)
    assert cache.lookup(K, [1, 2, 3, 9], cap=4) == (None, 0)     # 3 of 8: not worth it
    entry, n = cache.lookup(K, [1, 2, 3, 4, 5, 0], cap=5)
    assert entry is not None and n == 5
    assert cache.lookup(K, [1, 2, 3, 4, 5, 0], cap=5, exact=True) == (None, 0)
    assert cache.lookup(K, [1, 2, 3, 4, 5, 6, 7, 8, 9], cap=8, exact=True)[1] == 8


def test_budget_holds_under_many_offers():
    cache = PromptCache(500, min_tokens=1)
    for i in range(50):
        cache.offer(K, [i, i + 1, i + 2], *sized(37 + i % 50))
        assert cache.total_bytes <= 500
        cache.check_integrity()


def scan_lookup(cache: PromptCache, key: object, prompt: list[int], cap: int, exact: bool
                ) -> tuple[object, int]:
    """The lookup the contract describes, over every entry (no index)."""
    best: tuple[object, int] = (None, 0)
    for entry in cache.entries():
        size, n = len(entry.token_ids), 0
        while n < min(size, len(prompt)) and entry.token_ids[n] == prompt[n]:
            n += 1
        n = min(n, cap)
        if entry.key == key and not (exact and n < size) and n > best[1] \
                and n >= max(1, cache.min_fraction * size):
            best = (entry, n)
    return best


tokens_st = st.lists(st.integers(0, 2), min_size=0, max_size=12)


def scan_best(cache: PromptCache, key: object, prompt: list[int], cap: int, exact: bool
              ) -> tuple[set[int], int]:
    """Every entry tied for the scan's best usable prefix (by id), and that length."""
    _, best = scan_lookup(cache, key, prompt, cap, exact)
    tied = {id(e) for e in cache.entries() if best and e.key == key
            and (not exact or len(e.token_ids) == best)
            and best >= max(1, cache.min_fraction * len(e.token_ids))
            and list(e.token_ids[:best]) == prompt[:best]}
    return tied, best


@settings(max_examples=400, deadline=None)
@given(min_tokens=st.integers(0, 6), min_fraction=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
       ops=st.lists(st.tuples(st.sampled_from(["offer", "lookup", "touch"]),
                              st.sampled_from([K, ("other", "")]), tokens_st,
                              st.integers(0, 14), st.booleans()), max_size=40))
def test_the_prefix_index_answers_as_a_scan_of_every_entry(
        min_tokens: int, min_fraction: float, ops: list[tuple]) -> None:
    # Short token alphabets make prefixes shared, covered and equal (the index's edges split
    # and merge); a small budget evicts.
    cache = PromptCache(200, min_tokens=min_tokens, min_fraction=min_fraction)
    for op, key, tokens, cap, exact in ops:
        if op == "offer":
            before = [e for e in cache.entries() if e.key == key]
            covered = any(len(e.token_ids) >= len(tokens)
                          and list(e.token_ids[:len(tokens)]) == tokens for e in before)
            stored = cache.offer(key, tokens, *sized(len(tokens) * 3))
            assert stored == (len(tokens) >= min_tokens and not covered)
            if stored:
                assert cache.covers(key, tokens)
        elif op == "lookup":  # the longest usable prefix; any entry tied for it
            entry, n = cache.lookup(key, tokens, cap, exact=exact)
            tied, best = scan_best(cache, key, tokens, cap, exact)
            assert n == best
            assert (entry is None) if best == 0 else (id(entry) in tied)
        elif cache.entries():
            entry = cache.entries()[cap % len(cache.entries())]
            cache.touch(entry)
            assert cache.entries()[-1] is entry
        cache.check_integrity()
