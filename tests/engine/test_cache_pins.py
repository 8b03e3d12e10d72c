"""Pinned prompt-cache entries (``cache_pins``): kept through eviction pressure until their time
to live passes, within the pin budget (in all and per tenant), written exactly at the pinned
length, and counted in ``timings.pinned_tokens`` only by the request that wrote them."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_helpers import submit

from llamapy.engine import Engine, EngineConfig, EngineTuning, FakeBackend, FakeModel
from llamapy.engine.cache.disk import CacheNamespace
from llamapy.engine.cache.pin_table import PinOutcome
from llamapy.engine.cache.ram import CacheEntry, PromptCache
from llamapy.engine.request import CacheKey
from llamapy.engine.testing import drain
from llamapy.errors import InvalidOptionError
from llamapy.options import RequestOptions

A, B = CacheKey(None, "", (), "a"), CacheKey(None, "", (), "b")
K = CacheKey(None, "", ())


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def sized(n: int) -> tuple[Callable[[], int], Callable[[], bytes]]:
    return (lambda: n), (lambda: b"x" * n)


def firsts(cache: PromptCache) -> list[int]:
    return [e.token_ids[0] for e in cache.entries()]


# --- the RAM cache ----------------------------------------------------------------------------


def test_a_pin_survives_lru_pressure_until_its_ttl_then_is_evictable():
    clock = Clock()
    cache = PromptCache(400, min_tokens=1, clock=clock)  # 100 bytes an entry, 200 for pins
    assert cache.pin(K, [1], 1, 300, *sized(96)) is PinOutcome.WRITTEN
    for first in range(2, 10):
        assert cache.offer(K, [first], *sized(96))
        cache.check_integrity()
    assert firsts(cache) == [1, 7, 8, 9]  # the oldest, but pinned
    clock.t = 299.0
    assert cache.offer(K, [10], *sized(96))
    assert 1 in firsts(cache)
    clock.t = 300.0  # the deadline: an ordinary entry, the least recently used
    assert cache.offer(K, [11], *sized(96))
    assert 1 not in firsts(cache)
    assert len(cache.pins) == 0
    cache.check_integrity()


def test_a_hit_refreshes_the_deadline_and_writes_nothing():
    clock = Clock()
    cache = PromptCache(400, min_tokens=1, clock=clock)
    gets: list[int] = []
    assert cache.pin(K, [1, 2], 2, 300, lambda: 96, lambda: gets.append(1) or b"x" * 96) \
        is PinOutcome.WRITTEN
    clock.t = 250.0
    assert cache.pin(K, [1, 2, 3], 2, 300, lambda: 96, lambda: gets.append(1) or b"x" * 96) \
        is PinOutcome.REFRESHED
    assert gets == [1]  # serialised once
    clock.t = 500.0  # past the first deadline, before the refreshed one (550)
    for first in range(10, 20):
        cache.offer(K, [first], *sized(96))
    assert cache.lookup(K, [1, 2, 9], cap=2)[1] == 2
    cache.check_integrity()


def test_pins_stay_within_their_share_and_past_it_are_ordinary_entries():
    cache = PromptCache(400, min_tokens=1, clock=Clock())  # pins: at most 200 bytes
    assert cache.pin(K, [1], 1, 300, *sized(96)) is PinOutcome.WRITTEN
    assert cache.pin(K, [2], 1, 300, *sized(96)) is PinOutcome.WRITTEN
    assert cache.pin(K, [3], 1, 300, *sized(96)) is PinOutcome.STORED  # over 200: ordinary
    assert cache.pins.total_bytes == 200
    for first in range(4, 8):
        cache.offer(K, [first], *sized(96))
    assert sorted(firsts(cache))[:2] == [1, 2] and 3 not in firsts(cache)
    cache.check_integrity()


def test_each_tenant_pins_within_its_share_of_its_bound():
    cache = PromptCache(800, min_tokens=1, tenant_share=0.5, clock=Clock())  # a tenant: 400
    assert cache.pins.tenant_budget == 200
    assert cache.pin(A, [1], 1, 300, *sized(96)) is PinOutcome.WRITTEN
    assert cache.pin(A, [2], 1, 300, *sized(96)) is PinOutcome.WRITTEN
    assert cache.pin(A, [3], 1, 300, *sized(96)) is PinOutcome.STORED
    assert cache.pin(B, [4], 1, 300, *sized(96)) is PinOutcome.WRITTEN  # b has its own share
    for first in range(5, 12):  # a's pressure evicts a's unpinned entries only
        cache.offer(A, [first], *sized(96))
    assert {1, 2, 4} <= set(firsts(cache))
    assert cache.pins.pinned_bytes("a") == 200 and cache.pins.pinned_bytes("b") == 100
    cache.check_integrity()


def test_an_entry_that_fits_only_by_evicting_pins_is_not_stored():
    cache = PromptCache(400, min_tokens=1, clock=Clock())
    assert cache.pin(K, [1], 1, 300, *sized(196)) is PinOutcome.WRITTEN  # 200: the pin share
    assert not cache.offer(K, [2], *sized(296))  # 300 > the 200 left
    assert cache.offer(K, [3], *sized(196))
    assert firsts(cache) == [1, 3]
    cache.check_integrity()


def test_a_longer_entry_does_not_drop_the_pinned_prefix_it_covers():
    cache = PromptCache(1000, min_tokens=1, clock=Clock())
    assert cache.pin(K, [1, 2], 2, 300, *sized(96)) is PinOutcome.WRITTEN
    assert cache.offer(K, [1, 2, 3, 4], *sized(96))
    assert sorted(len(e.token_ids) for e in cache.entries()) == [2, 4]
    cache.check_integrity()


# --- the option --------------------------------------------------------------------------------


@pytest.mark.parametrize("pins", [[(0, 300)], [(5, 0)], [(5, 86_401)], [(5, 300)] * 5,
                                  [(5.0, 300)], [(True, 300)], ["ab"], [(1, 2, 3)], 7,
                                  [(5, float("nan"))]])
def test_bad_cache_pins_are_refused(pins: object):
    with pytest.raises(InvalidOptionError, match="cache_pins"):
        RequestOptions(cache_pins=pins)  # type: ignore[arg-type]


def test_cache_pins_are_stored_as_a_tuple_of_pairs():
    assert RequestOptions(cache_pins=[[12, 300], (40, 3600.0)]).cache_pins == \
        ((12, 300.0), (40, 3600.0))


# --- the engine ---------------------------------------------------------------------------------


def pin_engine(**config: object) -> tuple[Engine, FakeBackend]:
    backend = FakeBackend(n_ctx=1024, n_seq_max=1, model=FakeModel(n_vocab=4096),
                          state_bytes_per_token=1000)
    cfg = EngineConfig(**{"n_parallel": 1, "prompt_cache_ram_mb": 0.4, "chunk_size": 64,
                          **config})
    tuning = EngineTuning(ram_min_tokens=4, disk_min_tokens=4, disk_background=False)
    engine = Engine(backend, cfg, tuning=tuning, clock=backend.clock.now,
                    cache_namespace=CacheNamespace("fake") if "prompt_cache_dir" in config
                    else None)
    return engine, backend


SYSTEM = list(range(1, 41))  # 40 tokens


def turn(engine: Engine, rid: str, tail_first: int, **options: object):
    sink = submit(engine, rid, SYSTEM + list(range(tail_first, tail_first + 30)),
                  max_tokens=1, **options)
    drain(engine, each=engine.check_integrity)
    final = sink.final
    assert final is not None and final.finish_reason != "error"
    return final.timings


def test_a_pinned_system_prompt_survives_other_traffic_until_its_ttl():
    engine, backend = pin_engine()
    first = turn(engine, "r0", 100, cache_pins=[(40, 300)])
    assert (first.reused_tokens, first.pinned_tokens) == (0, 40)
    pinned = [e for e in engine.ram.entries() if len(e.token_ids) == 40]
    assert [e.token_ids for e in pinned] == [tuple(SYSTEM)]  # the chunk ended at the pin
    for i in range(12):  # other conversations, each 70 tokens: fills the 400 KB twice
        submit(engine, f"o{i}", list(range(200 + 70 * i, 270 + 70 * i)), max_tokens=1)
        drain(engine, each=engine.check_integrity)
    assert engine.ram.num_evictions > 0
    again = turn(engine, "r1", 300, cache_pins=[(40, 300)])
    assert (again.reused_tokens, again.reuse_source, again.pinned_tokens) == (40, "ram", 0)
    backend.clock.advance(301)
    for i in range(12):
        submit(engine, f"p{i}", list(range(1200 + 70 * i, 1270 + 70 * i)), max_tokens=1)
        drain(engine, each=engine.check_integrity)
    assert not engine.ram.covers(engine.ram.entries()[0].key, SYSTEM)
    late = turn(engine, "r2", 400)
    assert late.reused_tokens == 0


def pinned_lengths(engine: Engine) -> list[int]:
    ram = engine.ram
    return sorted(len(e.token_ids) for e in ram.entries() if ram.pins.is_pinned(ram._ids[id(e)]))


def test_reuse_stops_at_a_pinned_prefix_not_held_exactly_so_it_is_written_alone():
    engine, _ = pin_engine()
    turn(engine, "r0", 100)  # no pins: the slot keeps the 70-token prompt
    again = turn(engine, "r1", 100, cache_pins=[(40, 300), (70, 300)])
    assert (again.reused_tokens, again.reuse_source) == (40, "own")
    # the 40 written from the reuse; the cut offered the slot's 70 to the cache, so the whole
    # prompt's pin found it there: nothing counts as written past the reuse
    assert again.pinned_tokens == 0
    assert pinned_lengths(engine) == [40, 70]
    third = turn(engine, "r2", 100, cache_pins=[(40, 300), (70, 300)])
    assert (third.reused_tokens, third.pinned_tokens) == (69, 0)  # both were pinned already


def test_a_pin_past_the_reuse_counts_the_tokens_computed_and_written():
    engine, _ = pin_engine()
    turn(engine, "r0", 100, cache_pins=[(40, 300)])
    again = turn(engine, "r1", 500, cache_pins=[(40, 300), (70, 3600)])
    assert (again.reused_tokens, again.pinned_tokens) == (40, 30)
    assert pinned_lengths(engine) == [40, 70]


def test_pins_do_nothing_without_a_ram_cache():
    backend = FakeBackend(n_ctx=1024, n_seq_max=1, model=FakeModel(n_vocab=4096))
    engine = Engine(backend, EngineConfig(n_parallel=1), clock=backend.clock.now)
    sink = submit(engine, "r", SYSTEM + [99] * 30, max_tokens=1, cache_pins=[(40, 300)])
    drain(engine)
    assert sink.final is not None and sink.final.timings.pinned_tokens == 0


def test_a_pin_share_of_zero_pins_nothing_and_a_share_past_one_is_refused():
    cache = PromptCache(400, min_tokens=1, pin_share=0.0, clock=Clock())
    assert cache.pin(K, [1], 1, 300, *sized(96)) is PinOutcome.STORED
    assert cache.pins.total_bytes == 0
    with pytest.raises(ValueError, match="pin_share"):
        PromptCache(400, pin_share=1.5)


def disk_files(engine: Engine) -> dict[tuple[int, ...], int]:
    """The disk cache's files: tokens -> last use (wall-clock ns)."""
    return {f.header.token_ids: f.mtime_ns for f in engine.disk.files()}


def test_a_pin_is_filed_on_disk_until_its_deadline_and_outlives_eviction_and_covering(
        tmp_path: Path):
    engine, _ = pin_engine(prompt_cache_dir=str(tmp_path), prompt_cache_disk_mb=0.3)
    before = time.time_ns()
    turn(engine, "r0", 100, cache_pins=[(40, 3600)])
    assert disk_files(engine)[tuple(SYSTEM)] >= before + 3600 * 10**9
    for i in range(12):  # RAM evictions spill to the disk, over its budget
        submit(engine, f"o{i}", list(range(200 + 70 * i, 270 + 70 * i)), max_tokens=1)
        drain(engine, each=engine.check_integrity)
    files = disk_files(engine)
    assert engine.disk.num_evictions > 0
    assert tuple(SYSTEM) in files  # pinned: evicted after every unpinned file
    engine.disk.check_integrity()
    engine.close()
    again, _ = pin_engine(prompt_cache_dir=str(tmp_path), prompt_cache_disk_mb=0.3,
                          prompt_cache_ram_mb=0)
    late = turn(again, "r1", 900)
    assert (late.reused_tokens, late.reuse_source) == (40, "disk")  # a restart finds it
    again.close()


def test_a_longer_file_covering_a_pinned_one_does_not_drop_it(tmp_path: Path):
    engine, _ = pin_engine(prompt_cache_dir=str(tmp_path), prompt_cache_disk_mb=4)
    turn(engine, "r0", 100, cache_pins=[(40, 300)])
    pinned = engine.ram.entries()[0]
    entry = CacheEntry(pinned.key, (*SYSTEM, 7, 8, 9), b"x" * 100)
    assert engine.disk.offer_entry(entry)  # a longer prefix, covering the pinned 40
    assert {tuple(SYSTEM), entry.token_ids} <= disk_files(engine).keys()
    engine.close()
