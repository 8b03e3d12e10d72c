"""The disk prompt cache shared: background writes, bounded pending bytes, rescans when another
instance changed the folder, eviction by the last uses others made, and two instances (threads
and processes) on one folder keeping its budget and never corrupting each other."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from disk_helpers import TOKENS, K, cache, entry_files, sized, state

from llamapy.engine.cache.disk import DiskPromptCache
from llamapy.engine.cache.disk_format import file_size


def test_background_writes_are_visible_before_they_land(tmp_path, monkeypatch):
    disk = cache(tmp_path, background=True)
    gate = threading.Event()
    write_temp = disk.store.write_temp
    monkeypatch.setattr(disk.store, "write_temp", lambda chunks: (gate.wait(5),
                                                                   write_temp(chunks))[1])
    assert disk.offer(K, TOKENS, *sized(state(1000)))
    found, n = disk.lookup(K, TOKENS, 100)
    assert n == 100 and disk.read_async(found).result(5) == state(1000)
    assert entry_files(tmp_path) == []
    gate.set()
    disk.close()
    assert len(entry_files(tmp_path)) == 1
    assert cache(tmp_path).lookup(K, TOKENS, 100)[1] == 100


def test_pending_writes_are_bounded(tmp_path, monkeypatch):
    one = file_size("tenant-a", 100, 1000)
    disk = cache(tmp_path, background=True, max_pending_bytes=one)
    gate = threading.Event()
    write_temp = disk.store.write_temp
    monkeypatch.setattr(disk.store, "write_temp", lambda chunks: (gate.wait(5),
                                                                   write_temp(chunks))[1])
    assert disk.offer(K, TOKENS, *sized(state(1000)))
    assert not disk.offer(K, tuple(range(500, 600)), *sized(state(1000)))
    assert disk.num_dropped == 1
    gate.set()
    disk.close()


def counted_scans(disk: DiskPromptCache, monkeypatch) -> list[int]:
    """A list that grows by one at each rescan of ``disk``'s folder."""
    scans: list[int] = []
    scan = disk.store.scan
    monkeypatch.setattr(disk.store, "scan", lambda known: (scans.append(1), scan(known))[1])
    return scans


def test_own_writes_need_no_rescan_and_another_instances_do(tmp_path, monkeypatch):
    disk, other = cache(tmp_path), cache(tmp_path)
    scans = counted_scans(disk, monkeypatch)
    for i in range(3):
        assert disk.offer(K, tuple(range(i * 1000, i * 1000 + 100)), *sized(state(1000)))
        assert not disk.store.changed()
    assert scans == [] and disk.lookup(K, range(0, 100), 100)[1] == 100
    _, mtime = disk.store.version()
    assert other.offer(K, TOKENS, *sized(state(1000)))  # the generation moves...
    os.utime(tmp_path, ns=(mtime, mtime))  # (even if the clock tick hid the folder's change)
    assert disk.store.changed()
    assert disk.lookup(K, TOKENS, 100)[1] == 100 and scans == [1]  # ...so it rescans once
    assert disk.offer(K, tuple(range(9000, 9100)), *sized(state(1000)))
    assert scans == [1] and len(disk) == 5 and not disk.store.changed()
    disk.check_integrity()


def test_a_change_by_another_tool_is_seen_by_the_folders_mtime(tmp_path, monkeypatch):
    disk = cache(tmp_path)
    assert disk.offer(K, TOKENS, *sized(state(1000)))
    (path,) = entry_files(tmp_path)
    path.unlink()  # a user's rm: no generation moves...
    mtime = os.stat(tmp_path).st_mtime_ns + 10**9  # (and not within our change's clock tick)
    os.utime(tmp_path, ns=(mtime, mtime))
    assert disk.store.changed() and disk.lookup(K, TOKENS, 100) == (None, 0)
    assert len(disk) == 0


def test_eviction_reads_last_uses_another_instance_made(tmp_path, monkeypatch):
    one = file_size("tenant-a", 100, 1000)
    a, b = cache(tmp_path, budget=3 * one), cache(tmp_path, budget=3 * one)
    prompts = [tuple(range(i * 1000, i * 1000 + 100)) for i in range(3)]
    for p in prompts:
        assert a.offer(K, p, *sized(state(1000)))
    found, _ = b.lookup(K, prompts[0], 100)
    b.touch(found)  # the oldest is now the most recently used, in b only
    assert not a.store.changed()  # (a touch moves no generation)
    scans = counted_scans(a, monkeypatch)
    assert a.offer(K, tuple(range(5000, 5100)), *sized(state(1000)))
    assert scans == [] and a.num_evictions == 1
    assert {f.header.token_ids[0] for f in a.files()} == {0, 2000, 5000}
    assert {f.header.token_ids[0] for f in cache(tmp_path, budget=3 * one).files()} \
        == {0, 2000, 5000}


def test_an_instance_sees_what_another_wrote_and_evicted(tmp_path):
    one = file_size("tenant-a", 100, 1000)
    a, b = cache(tmp_path, budget=2 * one), cache(tmp_path, budget=2 * one)
    a.offer(K, TOKENS, *sized(state(1000)))
    found, n = b.lookup(K, TOKENS, 100)
    assert n == 100 and b.read(found) == state(1000)
    for i in (1, 2):
        b.offer(K, tuple(range(i * 1000, i * 1000 + 100)), *sized(state(1000)))
    assert a.lookup(K, TOKENS, 100) == (None, 0)  # b evicted it; a's index follows
    assert len(entry_files(tmp_path)) == 2


def test_a_lookup_leaves_the_rescan_of_a_changed_folder_to_the_writer_thread(tmp_path,
                                                                              monkeypatch):
    disk, other = cache(tmp_path, background=True), cache(tmp_path)
    scans: list[str] = []
    scan = disk.store.scan
    monkeypatch.setattr(disk.store, "scan", lambda known: (
        scans.append(threading.current_thread().name), scan(known))[1])
    queued: list[int] = []
    refresh = disk._queued_refresh
    monkeypatch.setattr(disk, "_queued_refresh", lambda: (queued.append(1), refresh())[1])
    gate = threading.Event()
    disk._writer.submit(gate.wait, 5)  # the writer is busy
    other.offer(K, TOKENS, *sized(state(1000)))  # another server writes
    for _ in range(3):  # answered from the index as it stands; one rescan queued
        assert disk.lookup(K, TOKENS, 100) == (None, 0)
    gate.set()
    disk._writer.submit(lambda: None).result(5)  # the writer's turn
    found, n = disk.lookup(K, TOKENS, 100)
    assert n == 100 and disk.read(found) == state(1000)
    assert len(queued) == 1
    assert len(scans) == 1 and scans[0].startswith("llamapy-disk-write")
    disk.close()


def test_threads_on_one_folder_keep_the_budget(tmp_path):
    one = file_size("tenant-a", 100, 1000)
    instances = [cache(tmp_path, budget=3 * one) for _ in range(3)]

    def hammer(disk: DiskPromptCache, base: int) -> None:
        for i in range(20):
            start = base + 1000 * i
            disk.offer(K, tuple(range(start, start + 100)), *sized(state(1000, i)))
            found, _ = disk.lookup(K, range(start, start + 100), 100)
            assert found is None or disk.read(found) in (None, state(1000, i))

    threads = [threading.Thread(target=hammer, args=(d, 100_000 * k))
               for k, d in enumerate(instances)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check = cache(tmp_path, budget=3 * one)
    assert check.store.num_bad_files == 0 and check.total_bytes <= 3 * one
    for disk in instances:  # the views kept without a rescan are the folder, and rescans too
        if not disk.store.changed():
            assert_view_is_the_folder(disk, tmp_path)
        disk.refresh()
        assert_view_is_the_folder(disk, tmp_path)


def assert_view_is_the_folder(disk: DiskPromptCache, folder: Path) -> None:
    disk.check_integrity()
    assert {f.name for f in disk.files()} == {p.name for p in entry_files(folder)}
    assert disk.total_bytes == sum(p.stat().st_size for p in entry_files(folder))


def test_a_write_failing_under_the_lock_moves_the_generation_and_leaves_no_temp(
        tmp_path, monkeypatch):
    disk, other = cache(tmp_path), cache(tmp_path)
    assert disk.offer(K, TOKENS, *sized(state(1000)))
    other.refresh()
    scans, replace, fail = counted_scans(disk, monkeypatch), os.replace, [OSError(28, "full")]

    def full_once(src: object, dst: object) -> None:
        if fail:
            raise fail.pop()
        replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", full_once)
    assert disk.offer(K, tuple(range(500, 600)), *sized(state(1000)))
    assert disk.num_write_failures == 1 and list((tmp_path / ".tmp").iterdir()) == []
    assert other.store.changed() and disk.store.changed()  # a change may have begun
    assert disk.offer(K, tuple(range(700, 800)), *sized(state(1000)))
    assert scans == [1]  # so the next write rescans first
    assert_view_is_the_folder(disk, tmp_path)


_WRITER = """
import os
import sys
from llamapy.engine.cache.disk import CacheNamespace, DiskPromptCache
from llamapy.engine.request import CacheKey
folder, base, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
disk = DiskPromptCache(folder, budget, namespace=CacheNamespace("model-A"), min_tokens=4,
                       background=False)
for i in range(30):
    start = base + 1000 * i
    data = bytes([i]) * 1000
    disk.offer(CacheKey("tenant-a", "", ()), range(start, start + 100), lambda: 1000,
               lambda: data)
    found, n = disk.lookup(CacheKey("tenant-a", "", ()), range(start, start + 100), 100)
    assert found is None or disk.read(found) in (None, data)
assert disk.store.num_bad_files == 0
with disk.store.lock() as fresh:  # a view kept without rescans is the folder
    if fresh:
        names = {n for n in os.listdir(folder) if n.endswith(".lpkv")}
        assert {f.name for f in disk.files()} == names
        assert disk.total_bytes == sum(os.path.getsize(os.path.join(folder, n)) for n in names)
disk.check_integrity()
"""


def test_two_processes_on_one_folder_do_not_corrupt_each_other(tmp_path):
    budget = 4 * file_size("tenant-a", 100, 1000)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(base),
                               str(budget)], env=env) for base in (0, 10**6)]
    assert [p.wait(60) for p in procs] == [0, 0]
    check = cache(tmp_path, budget=budget)
    assert check.store.num_bad_files == 0 and 0 < check.total_bytes <= budget
    for f in check.files():
        assert check.read(f) is not None
