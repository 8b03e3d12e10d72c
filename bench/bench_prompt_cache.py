#!/usr/bin/env python3
"""The prompt caches' bookkeeping with many entries behind one system prompt.

Fills a :class:`~llamapy.engine.cache.ram.PromptCache` with ``--entries`` conversations of
500-1,500 random tokens that all start with the same ``--system`` tokens (no model: the cost
measured is the index, which runs on the engine's tick thread), then times a lookup for a new
conversation (it shares only the system prompt), a lookup for an entry's next turn, an offer
and a cover check. ``--disk`` does the same with a
:class:`~llamapy.engine.cache.disk.DiskPromptCache` in a temporary folder (tiny states; the
offer timed is one the cover check refuses, the part that runs on the tick thread), a
write (what the writer thread does per entry, holding the GIL for its Python part), and a
lookup right after another instance wrote to the folder, with and without background threads
(without, the lookup rescans the folder itself). Usage:
``python bench/bench_prompt_cache.py [--entries 1000] [--system 300] [--disk]``.
"""

from __future__ import annotations

import argparse
import itertools
import random
import tempfile
import time
from collections.abc import Callable

from llamapy.engine.cache.disk import CacheNamespace, DiskPromptCache
from llamapy.engine.cache.ram import PromptCache
from llamapy.engine.request import CacheKey


def per_call_ms(fn: Callable[[], object], n: int = 20) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=1000)
    p.add_argument("--system", type=int, default=300)
    p.add_argument("--disk", action="store_true", help="time the disk cache instead")
    args = p.parse_args()
    if args.disk:
        with tempfile.TemporaryDirectory() as folder:
            disk_main(folder, args.entries, args.system)
        return
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(49152) for _ in range(n)]

    system = tokens(args.system)
    cache = PromptCache(1 << 50)
    started = time.perf_counter()
    for _ in range(args.entries):
        cache.offer("k", system + tokens(rng.randrange(200, 1200)), lambda: 1000,
                    lambda: bytes(1000))
    fill_s = time.perf_counter() - started
    new_chat = system + tokens(400)
    next_turn = list(cache.entries()[len(cache) // 2].token_ids) + tokens(150)
    print(f"{len(cache)} entries behind a {args.system}-token system prompt "
          f"(filled in {fill_s:.2f} s)")
    new_ms = per_call_ms(lambda: cache.lookup("k", new_chat, 1 << 30))
    next_ms = per_call_ms(lambda: cache.lookup("k", next_turn, 1 << 30))
    print(f"lookup, new conversation: {new_ms:.3f} ms")
    print(f"lookup, next turn: {next_ms:.3f} ms")
    print(f"cover check: {per_call_ms(lambda: cache.covers('k', next_turn)):.3f} ms")
    started = time.perf_counter()
    cache.offer("k", system + tokens(500), lambda: 1000, lambda: bytes(1000))
    print(f"offer: {(time.perf_counter() - started) * 1e3:.3f} ms")


def disk_main(folder: str, entries: int, system_len: int) -> None:
    """The disk cache's lookups and cover check, with ``entries`` files in ``folder``."""
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(49152) for _ in range(n)]

    key, state = CacheKey(None, "", ()), bytes(64)
    disk = DiskPromptCache(folder, 1 << 40, namespace=CacheNamespace("bench"),
                           background=False)
    system = tokens(system_len)
    started = time.perf_counter()
    for _ in range(entries):
        disk.offer(key, system + tokens(rng.randrange(200, 1200)), lambda: 64, lambda: state)
    fill_s = time.perf_counter() - started
    some = disk.files()[len(disk) // 2].header.token_ids
    new_chat, next_turn = system + tokens(400), list(some) + tokens(150)
    print(f"{len(disk)} files behind a {system_len}-token system prompt "
          f"(written in {fill_s:.2f} s)")
    write_ms = per_call_ms(lambda: disk.offer(key, system + tokens(600), lambda: 64,
                                              lambda: state))
    new_ms = per_call_ms(lambda: disk.lookup(key, new_chat, 1 << 30))
    next_ms = per_call_ms(lambda: disk.lookup(key, next_turn, 1 << 30))
    covered = list(some[:len(some) // 2])
    offer_ms = per_call_ms(lambda: disk.offer(key, covered, lambda: 64, lambda: state))
    print(f"write (on the calling thread: file, index, covered, eviction): {write_ms:.3f} ms")
    print(f"lookup, new conversation: {new_ms:.3f} ms")
    print(f"lookup, next turn: {next_ms:.3f} ms")
    print(f"offer refused by the cover check: {offer_ms:.3f} ms")
    disk.close()
    for background in (False, True):
        print(f"lookup after another server's write, background={background}: "
              f"{foreign_write_ms(folder, key, new_chat, background):.3f} ms")


_FRESH = itertools.count(60_000)


def foreign_write_ms(folder: str, key: CacheKey, prompt: list[int], background: bool) -> float:
    """A lookup's time on the calling thread just after another instance wrote to ``folder``
    (median of 10)."""
    mine = DiskPromptCache(folder, 1 << 40, namespace=CacheNamespace("bench"),
                           background=background)
    other = DiskPromptCache(folder, 1 << 40, namespace=CacheNamespace("bench"),
                            background=False)
    times = []
    for _ in range(10):
        time.sleep(0.1)  # (the previous write's rescans are over)
        tail = [next(_FRESH)] * 2  # (a new entry: an offer of a known one writes nothing)
        assert other.offer(key, [*prompt[:-2], *tail], lambda: 64, lambda: bytes(64))
        started = time.perf_counter()
        mine.lookup(key, prompt, 1 << 30)
        times.append((time.perf_counter() - started) * 1e3)
    mine.close()
    other.close()
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    main()
