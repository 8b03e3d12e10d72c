"""The prompt caches' radix tree answers as a scan of its items, through adds and removes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.engine.cache.radix import PrefixTrie, restorable
from llamapy.engine.cache.ram import common_prefix

# A two-token alphabet and a shared head make items prefixes of each other, equal, and split
# edges at every depth; removes merge them again.
tokens_st = st.tuples(st.integers(0, 3), st.lists(st.integers(0, 1), max_size=10)).map(
    lambda t: (7,) * t[0] + tuple(t[1]))


def scan(items: dict[int, tuple[int, ...]], prompt: tuple[int, ...], frac: float,
         exact: bool) -> tuple[set[int], int]:
    usable = restorable(frac, exact)
    best, tied = 0, set()
    for item_id, tokens in items.items():
        n = common_prefix(tokens, prompt)
        if not usable(n, len(tokens)):
            continue
        if n > best:
            best, tied = n, set()
        if n == best:
            tied.add(item_id)
    return tied, best


@settings(max_examples=400, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "add", "remove", "look"]), tokens_st,
                              st.integers(0, 30), st.sampled_from([0.0, 0.5, 0.8, 1.0]),
                              st.booleans()), max_size=40))
def test_the_trie_answers_as_a_scan(ops: list[tuple]) -> None:
    trie, items, next_id = PrefixTrie(), {}, 0
    for op, tokens, pick, frac, exact in ops:
        if op == "add":
            trie.add(next_id, tokens)
            items[next_id] = tokens
            next_id += 1
        elif op == "remove" and items:
            item_id = sorted(items)[pick % len(items)]
            trie.remove(item_id, items.pop(item_id))
        else:
            found, n = trie.best(tokens, restorable(frac, exact))
            tied, best = scan(items, tokens, frac, exact)
            assert n == best
            assert (found is None) if best == 0 else found in tied
            assert trie.extends(tokens) == any(t[:len(tokens)] == tokens for t in items.values())
            assert sorted(trie.prefixes_of(tokens)) == sorted(
                i for i, t in items.items() if tokens[:len(t)] == t)
        assert trie.size == len(items)
        assert sorted((i, t) for i, t, _ in trie.items()) == sorted(items.items())
        trie.check()


def test_a_lookup_does_not_weigh_the_entries_it_leaves_one_by_one() -> None:
    # 2,000 conversations behind one system prompt: a new conversation is judged from the
    # nodes of its path (one per shared head), not from each conversation in turn.
    trie, system = PrefixTrie(), tuple(range(300))
    for i in range(2000):
        trie.add(i, (*system, 1000 + i, 5, 6, 7))
    calls: list[tuple[int, int]] = []
    rule = restorable(0.5, False)

    def usable(n: int, size: int) -> bool:
        calls.append((n, size))
        return rule(n, size)

    found, n = trie.best((*system, 99_999), usable)
    assert n == 300 and found is not None
    assert len(calls) <= 2
    calls.clear()
    found, n = trie.best((*system, 1500, 5, 6, 7, 8), usable)
    assert (found, n) == (500, 304) and len(calls) == 1
