"""Per-tenant budgets of the RAM and disk prompt caches: a tenant at its share evicts its own
entries, the disk index knows each file's tenant after a restart, old files still read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from engine_helpers import make_engine, submit

from llamapy.engine.cache.disk import CacheNamespace, DiskPromptCache
from llamapy.engine.cache.disk_format import encode_entry, entry_identity, file_size, read_header
from llamapy.engine.cache.disk_store import SUFFIX
from llamapy.engine.cache.ram import PromptCache
from llamapy.engine.request import CacheKey
from llamapy.engine.testing import drain

A, B = CacheKey(None, "", (), "a"), CacheKey(None, "", (), "b")
NONE = CacheKey("scope", "", ())
NS = CacheNamespace("model")


def sized(n: int) -> tuple[Callable[[], int], Callable[[], bytes]]:
    return (lambda: n), (lambda: b"x" * n)


def owners(cache: PromptCache) -> list[tuple[str | None, int]]:
    return [(e.key.tenant, e.token_ids[0]) for e in cache.entries()]


# --- RAM ---------------------------------------------------------------------------------------


def test_a_tenant_at_its_share_evicts_its_own_entries_first():
    cache = PromptCache(400, min_tokens=1, tenant_share=0.5)  # 100 bytes an entry, 200 a tenant
    assert cache.tenant_budget == 200
    assert cache.offer(B, [1], *sized(96))
    for first in (2, 3, 4, 5):
        assert cache.offer(A, [first], *sized(96))
    # a's third and fourth entries each evicted a's own oldest, never b's
    assert owners(cache) == [("b", 1), ("a", 4), ("a", 5)]
    assert cache.tenant_bytes() == {"b": 100, "a": 200}
    cache.check_integrity()


def test_below_its_share_a_tenant_evicts_the_least_recently_used_whoevers():
    cache = PromptCache(400, min_tokens=1, tenant_share=0.5)
    assert cache.offer(A, [1], *sized(96))
    assert cache.offer(B, [2], *sized(96))
    assert cache.offer(B, [3], *sized(96))
    assert cache.offer(NONE, [4], *sized(96))
    assert cache.offer(NONE, [5], *sized(96))  # full, the default tenant under its share:
    assert owners(cache) == [("b", 2), ("b", 3), (None, 4), (None, 5)]  # the oldest, a's, goes
    entry, _ = cache.lookup(B, [2], cap=1)
    cache.touch(entry)  # b's [2] is now the most recently used; b's own LRU is [3]
    assert cache.offer(B, [6], *sized(96))  # b at its share: its own oldest, [3], goes
    assert owners(cache) == [(None, 4), (None, 5), ("b", 2), ("b", 6)]
    cache.check_integrity()


def test_an_entry_over_the_tenant_budget_is_never_serialised():
    cache = PromptCache(400, min_tokens=1, tenant_share=0.25)
    never = (lambda: 97, lambda: (_ for _ in ()).throw(AssertionError("serialised")))
    assert not cache.offer(A, [1], *never)  # 97 + 4 > 100
    assert cache.offer(A, [1], *sized(96)) and len(cache) == 1


def test_a_share_of_one_is_one_lru_for_all_tenants():
    cache = PromptCache(300, min_tokens=1)
    for key, first in ((A, 1), (B, 2), (A, 3), (A, 4), (A, 5)):
        assert cache.offer(key, [first], *sized(96))
    assert owners(cache) == [("a", 3), ("a", 4), ("a", 5)]  # as without tenants
    cache.check_integrity()


# --- disk --------------------------------------------------------------------------------------


def disk(folder: Path, budget: int, share: float = 0.5) -> DiskPromptCache:
    return DiskPromptCache(folder, budget, namespace=NS, min_tokens=1, background=False,
                           tenant_share=share)


def test_disk_files_name_their_tenant_and_the_share_holds_across_restarts(tmp_path):
    size = file_size(None, 4, 1000, "a")
    cache = disk(tmp_path, 4 * size)
    assert cache.offer(B, [9, 1, 1, 1], *sized(1000))
    for first in (1, 2, 3):
        assert cache.offer(A, [first, 1, 1, 1], *sized(1000))
    assert cache.tenant_bytes() == {"a": 2 * size, "b": size}
    kept = sorted(cache.token_ids(f)[0] for f in cache.files())
    assert kept == [2, 3, 9]  # a's oldest went, b's stayed
    cache.check_integrity()
    cache.close()
    again = disk(tmp_path, 4 * size)  # the index rebuilt from the headers knows the tenants
    assert again.tenant_bytes() == {"a": 2 * size, "b": size}
    assert {f.header.tenant for f in again.files()} == {"a", "b"}
    again.close()
    smaller = disk(tmp_path, 4 * size, share=0.25)  # a smaller share at start evicts a's LRU
    assert smaller.tenant_bytes() == {"a": size, "b": size}
    assert sorted(smaller.token_ids(f)[0] for f in smaller.files()) == [3, 9]
    smaller.check_integrity()
    smaller.close()


def test_the_metadata_names_a_tenant_only_when_there_is_one(tmp_path):
    def meta(key: CacheKey) -> dict:
        header = b"".join(encode_entry(entry_identity(NS, key), key.cache_scope, (1, 2),
                                       b"s", key.tenant)[:2])
        return json.loads(header[96:96 + int.from_bytes(header[12:16], "little")])

    assert meta(NONE) == {"scope": "scope"}  # byte for byte as before tenants
    assert meta(A) == {"scope": None, "tenant": "a"}


def test_a_file_written_before_tenants_reads_as_the_default_tenant(tmp_path):
    chunks = encode_entry(entry_identity(NS, NONE), "scope", (1, 2, 3, 4), b"state")
    path = tmp_path / ("0" * 32 + "-" + "1" * 32 + SUFFIX)
    path.write_bytes(b"".join(chunks))
    with open(path, "rb") as f:
        assert read_header(f, path.stat().st_size).tenant is None
    cache = disk(tmp_path, 1 << 20)
    assert cache.tenant_bytes() == {None: path.stat().st_size}
    found, n = cache.lookup(NONE, [1, 2, 3, 4, 5], cap=5)
    assert n == 4 and cache.read(found) == b"state"
    cache.close()


# --- the engine --------------------------------------------------------------------------------


def flood_then_return(share: float) -> tuple[object, int]:
    """Tenant b runs one prompt, tenant a then runs eight others, b runs its prompt again:
    the engine and the prompt tokens b reused from the RAM cache."""
    engine, _ = make_engine(n_parallel=1, prompt_cache_ram_mb=0.01, tenant_cache_share=share,
                            cache_idle_slots=False)
    submit(engine, "b0", [7] * 40, max_tokens=1, tenant="b")
    drain(engine)
    for i in range(8):  # each replaces the slot's prefix, which goes to the RAM cache
        submit(engine, i, [i + 10] * 40, max_tokens=1, tenant="a")
        drain(engine, each=engine.check_integrity)
        assert all(n <= engine.ram.tenant_budget for n in engine.ram.tenant_bytes().values())
    reused = engine.counters.reused["ram"]
    submit(engine, "b1", [7] * 40, max_tokens=1, tenant="b")
    drain(engine)
    return engine, engine.counters.reused["ram"] - reused


def test_a_flooding_tenant_does_not_evict_another_tenants_ram_entries():
    engine, reused = flood_then_return(0.5)
    assert engine.ram.tenant_budget == engine.ram.budget_bytes // 2
    assert reused == 39  # b's prefix survived a's flood
    _, reused = flood_then_return(1.0)  # without a share, a's flood evicts it
    assert reused == 0
