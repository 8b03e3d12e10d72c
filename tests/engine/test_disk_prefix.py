"""The disk prompt cache in the engine (fake backend): discarded and RAM-evicted prefixes are
restored from disk, a "restart" (a new engine and backend on the same folder) reuses what the
last one persisted at close, reads run off the tick thread, and nothing crosses a scope or a
model. Every output equals the fake model's reference."""

from __future__ import annotations

import threading

import pytest
from engine_helpers import make_engine, ref, submit

from llamapy.engine import EngineTuning
from llamapy.engine.cache.disk import CacheNamespace
from llamapy.engine.cache.disk_store import SUFFIX
from llamapy.engine.testing import drain
from llamapy.errors import InvalidOptionError

SYSTEM = list(range(1, 41))
LONG_A = [*SYSTEM, *range(41, 61)]
LONG_B = list(range(61, 121))


def run_all(engine):
    drain(engine, each=lambda: (engine.check_integrity(), engine.backend.check_integrity()))


def disk_engine(folder, *, namespace="model-A", background=False, ram_mb=0, **kw):
    tuning = EngineTuning(ram_min_tokens=8, disk_min_tokens=8, disk_background=background)
    kw.setdefault("n_parallel", 1)
    engine, backend = make_engine(n_ctx=512, prompt_cache_ram_mb=ram_mb,
                                  prompt_cache_dir=str(folder), tuning=tuning,
                                  cache_namespace=CacheNamespace(namespace), **kw)
    return engine, backend


def evict_a(engine, **options):
    submit(engine, "a1", LONG_A, max_tokens=2, **options)
    run_all(engine)
    submit(engine, "b1", LONG_B, max_tokens=2, **options)  # destroys A's prefix
    run_all(engine)


def test_a_folder_without_a_namespace_is_refused(tmp_path):
    with pytest.raises(InvalidOptionError, match="namespace"):
        make_engine(prompt_cache_dir=str(tmp_path))


def test_a_discarded_prefix_is_restored_from_disk_when_ram_is_off(tmp_path):
    engine, backend = disk_engine(tmp_path)
    evict_a(engine)
    assert len(engine.disk) == 1 and engine.stats().counters.num_disk_writes == 1
    sink = submit(engine, "a2", [*LONG_A, 5], max_tokens=3)
    run_all(engine)
    assert sink.final.timings.reuse_source == "disk"
    assert sink.final.timings.reused_tokens == len(LONG_A)
    assert engine.counters.restores["disk"] == 1 and engine.counters.reused["disk"] == 60
    assert sink.tokens == ref(backend, [*LONG_A, 5], 3)


def test_ram_evictions_spill_to_disk(tmp_path):
    # 0.005 MiB holds one 60-token prefix (60 * 68 bytes), not two
    engine, backend = disk_engine(tmp_path, ram_mb=0.005)
    evict_a(engine)
    submit(engine, "c1", list(range(200, 260)), max_tokens=2)  # B to RAM evicts A to disk
    run_all(engine)
    assert engine.ram.num_evictions >= 1 and len(engine.disk) >= 1
    sink = submit(engine, "a2", [*LONG_A, 5], max_tokens=3)
    run_all(engine)
    assert sink.final.timings.reuse_source == "disk"
    assert sink.tokens == ref(backend, [*LONG_A, 5], 3)


def test_ram_wins_over_disk_for_the_same_prefix(tmp_path):
    engine, _ = disk_engine(tmp_path, ram_mb=1)
    evict_a(engine)
    engine.prefix.persist()  # the same prefix on disk too
    sink = submit(engine, "a2", [*LONG_A, 5], max_tokens=2)
    run_all(engine)
    assert sink.final.timings.reuse_source == "ram"


@pytest.mark.parametrize("background", [False, True])
def test_a_restart_reuses_what_the_last_engine_persisted(tmp_path, background):
    first, _ = disk_engine(tmp_path, background=background)
    submit(first, "a1", LONG_A, max_tokens=2)
    run_all(first)
    first.close()  # the slot's prefix is written at close
    engine, backend = disk_engine(tmp_path, background=background)
    assert len(engine.disk) == 1
    sink = submit(engine, "a2", [*LONG_A, 5], max_tokens=4)
    run_all(engine)
    assert sink.final.timings.reuse_source == "disk"
    assert sink.final.timings.reused_tokens >= len(LONG_A)
    assert sink.tokens == ref(backend, [*LONG_A, 5], 4)
    engine.close()


def test_corrupt_files_after_a_restart_cost_a_prefill_not_an_answer(tmp_path):
    first, _ = disk_engine(tmp_path)
    evict_a(first)
    first.close()
    for path in tmp_path.glob("*" + SUFFIX):
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF  # the state's last byte: only the read finds it
        path.write_bytes(bytes(data))
    engine, backend = disk_engine(tmp_path)
    sink = submit(engine, "a2", [*LONG_A, 5], max_tokens=3)
    run_all(engine)
    assert sink.final.timings.reused_tokens == 0
    assert engine.counters.restore_failures["disk"] == 1
    assert sink.tokens == ref(backend, [*LONG_A, 5], 3)


def test_a_failed_restore_falls_back_to_prefill(tmp_path):
    engine, backend = disk_engine(tmp_path)
    evict_a(engine)
    backend.inject("restore_fail")
    sink = submit(engine, "a2", [*LONG_A, 5], max_tokens=2)
    run_all(engine)
    assert engine.counters.restore_failures["disk"] == 1 and sink.final.timings.reused_tokens == 0
    assert sink.tokens == ref(backend, [*LONG_A, 5], 2)


@pytest.mark.parametrize("other", [{"cache_scope": "t2"}, {"namespace": "model-B"},
                                   {"identity": "manifest-2"}])
def test_another_scope_identity_or_model_never_reads_it(tmp_path, other):
    first, _ = disk_engine(tmp_path)
    evict_a(first, cache_scope="t1")
    first.close()
    engine, backend = disk_engine(tmp_path, namespace=other.get("namespace", "model-A"))
    sink = submit(engine, "a2", [*LONG_A, 5], max_tokens=2,
                  cache_scope=other.get("cache_scope", "t1"), identity=other.get("identity", ""))
    run_all(engine)  # (the fake backend records any read of another key's cells)
    assert sink.final.timings.reused_tokens == 0
    assert sink.tokens == ref(backend, [*LONG_A, 5], 2)


def slow_reads(engine, monkeypatch):
    """Make the disk cache's reads wait for the returned event."""
    gate = threading.Event()
    read = engine.disk.read
    monkeypatch.setattr(engine.disk, "read", lambda entry: (gate.wait(10), read(entry))[1])
    return gate


def test_a_slow_read_does_not_stall_other_slots(tmp_path, monkeypatch):
    first, _ = disk_engine(tmp_path)
    evict_a(first)
    first.close()
    engine, backend = disk_engine(tmp_path, background=True, n_parallel=2)
    gate = slow_reads(engine, monkeypatch)
    other = submit(engine, "x", list(range(300, 340)), max_tokens=20)
    waiting = submit(engine, "a2", [*LONG_A, 5], max_tokens=2)
    for _ in range(25):  # the other request runs to its end while "a2" waits for its read
        engine.tick()
        engine.check_integrity()
    assert other.final is not None and waiting.tokens == []
    gate.set()
    run_all(engine)
    assert waiting.final.timings.reuse_source == "disk"
    assert waiting.tokens == ref(backend, [*LONG_A, 5], 2)
    assert other.tokens == ref(backend, list(range(300, 340)), 20)
    engine.close()


def test_cancelling_a_run_that_waits_for_a_read(tmp_path, monkeypatch):
    first, _ = disk_engine(tmp_path)
    evict_a(first)
    first.close()
    engine, backend = disk_engine(tmp_path, background=True)
    gate = slow_reads(engine, monkeypatch)
    sink = submit(engine, "a2", [*LONG_A, 5], max_tokens=2)
    engine.tick()
    assert engine.disk.reads.pending
    engine.cancel("a2")
    assert sink.finish_reason == "cancelled" and not engine.disk.reads.pending
    gate.set()
    engine.check_integrity()
    again = submit(engine, "a3", [*LONG_A, 6], max_tokens=2)
    run_all(engine)
    assert again.final.timings.reuse_source == "disk"
    assert again.tokens == ref(backend, [*LONG_A, 6], 2)
    engine.close()


def test_a_read_that_takes_too_long_is_abandoned(tmp_path, monkeypatch):
    first, _ = disk_engine(tmp_path)
    evict_a(first)
    first.close()
    engine, backend = disk_engine(tmp_path, background=True)
    engine.disk.reads.wait_s = 0.05
    gate = slow_reads(engine, monkeypatch)
    sink = submit(engine, "a2", [*LONG_A, 5], max_tokens=2)
    run_all(engine)
    gate.set()
    assert sink.final.timings.reused_tokens == 0 and engine.counters.restore_failures["disk"] == 1
    assert sink.tokens == ref(backend, [*LONG_A, 5], 2)
    engine.close()


def test_stats_report_the_disk_cache(tmp_path):
    engine, _ = disk_engine(tmp_path)
    evict_a(engine)
    stats = engine.stats().as_dict()
    assert stats["disk_cache_entries"] == 1 and stats["num_disk_writes"] == 1
    assert 0 < stats["disk_cache_bytes"] <= stats["disk_cache_budget_bytes"]
    assert stats["disk_cache_bad_files"] == 0


def test_close_persists_the_most_recent_first_and_the_disk_keeps_that_order(tmp_path):
    one = EngineTuning(disk_min_tokens=8, disk_background=False)
    engine, _ = make_engine(n_parallel=2, n_ctx=512, prompt_cache_dir=str(tmp_path),
                            prompt_cache_disk_mb=0.006,  # room for one 60-token prefix
                            tuning=one, cache_namespace=CacheNamespace("model-A"))
    for rid, prompt in (("a", LONG_A), ("b", LONG_B)):  # b is the most recently used
        submit(engine, rid, prompt, max_tokens=2)
        run_all(engine)
    engine.close()
    again, backend = disk_engine(tmp_path, n_parallel=2)
    assert [f.header.token_ids[:3] for f in again.disk.files()] == [tuple(LONG_B[:3])]
    sink = submit(again, "b2", [*LONG_B, 9], max_tokens=2)
    run_all(again)
    assert sink.final.timings.reuse_source == "disk"
    assert sink.tokens == ref(backend, [*LONG_B, 9], 2)
