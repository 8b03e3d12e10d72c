"""The disk prompt cache's store: round trip, budget and LRU across restarts (new instances on
one folder), atomic writes, every class of corrupt byte and identity/scope isolation (sharing a
folder: ``test_disk_sharing``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from disk_helpers import NS, TOKENS, K, cache, entry_files, sized, state

from llamapy.engine.cache.disk import CacheNamespace, DiskPromptCache
from llamapy.engine.cache.disk_format import FORMAT_VERSION, MAGIC, file_size
from llamapy.engine.cache.disk_store import SUFFIX
from llamapy.engine.request import CacheKey


def test_disabled_without_a_folder_or_budget(tmp_path):
    for disk in (DiskPromptCache(None, 1 << 20, namespace=NS), cache(tmp_path, 0)):
        assert not disk.enabled
        assert not disk.offer(K, TOKENS, *sized(state(10)))
        assert disk.lookup(K, TOKENS, 100) == (None, 0)
    assert entry_files(tmp_path) == []


def test_round_trip_and_restart(tmp_path):
    disk = cache(tmp_path)
    assert disk.offer(K, TOKENS, *sized(state(1000)))
    assert len(entry_files(tmp_path)) == 1 and disk.num_writes == 1
    disk.close()
    again = cache(tmp_path)  # a restart: the index is rebuilt from the headers
    found, n = again.lookup(K, [*TOKENS, 5, 6], cap=101)
    assert n == 100 and again.token_ids(found) == TOKENS
    assert again.read(found) == state(1000)
    assert again.lookup(K, TOKENS, cap=60)[1] == 60  # capped
    assert again.lookup(K, TOKENS[:40], cap=100) == (None, 0)  # 40 of 100: not worth it
    assert again.total_bytes == file_size("tenant-a", 100, 1000)
    again.check_integrity()


def test_short_covered_and_oversized_prefixes_are_skipped_without_serialising(tmp_path):
    disk = cache(tmp_path, budget=file_size("tenant-a", 100, 1000))
    never = (lambda: pytest.fail("sized"), lambda: pytest.fail("serialised"))
    assert not disk.offer(K, [1, 2, 3], *never)                       # under min_tokens
    assert not disk.offer(K, TOKENS, lambda: 1001, never[1])         # over the budget
    assert disk.offer(K, TOKENS, *sized(state(1000)))                # exactly the budget
    assert not disk.offer(K, TOKENS[:50], *never)                    # covered
    assert not disk.offer(K, TOKENS, lambda: 10, lambda: state(2000))  # size understated
    assert len(entry_files(tmp_path)) == 1


def test_an_extension_replaces_the_entries_it_covers(tmp_path):
    disk = cache(tmp_path)
    disk.offer(K, TOKENS[:50], *sized(state(100)))
    disk.offer(K, TOKENS, *sized(state(200)))
    assert [f.header.token_ids for f in disk.files()] == [TOKENS]
    assert len(entry_files(tmp_path)) == 1


def test_lru_by_use_across_restarts(tmp_path):
    one = file_size("tenant-a", 100, 1000)
    disk = cache(tmp_path, budget=3 * one)
    prompts = [tuple(range(i * 1000, i * 1000 + 100)) for i in range(3)]
    for p in prompts:
        assert disk.offer(K, p, *sized(state(1000)))
    found, _ = disk.lookup(K, prompts[0], 100)
    disk.touch(found)  # the first is now the most recently used
    disk.close()
    again = cache(tmp_path, budget=3 * one)
    assert again.offer(K, tuple(range(5000, 5100)), *sized(state(1000)))
    kept = {f.header.token_ids[0] for f in again.files()}
    assert kept == {0, 2000, 5000} and again.num_evictions == 1
    smaller = cache(tmp_path, budget=2 * one)  # a restart under a smaller budget evicts at once
    assert {f.header.token_ids[0] for f in smaller.files()} == {0, 5000}
    assert len(entry_files(tmp_path)) == 2
    smaller.check_integrity()


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    disk = cache(tmp_path)

    def broken(chunks):
        (disk.store.temp_folder / "w-partial.part").write_bytes(chunks[0][:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk.store, "write_temp", broken)
    assert disk.offer(K, TOKENS, *sized(state(1000)))  # accepted; the write then fails
    assert disk.num_write_failures == 1 and entry_files(tmp_path) == []
    assert disk.lookup(K, TOKENS, 100) == (None, 0)


def test_left_over_temp_files_are_never_read(tmp_path):
    disk = cache(tmp_path)
    disk.offer(K, TOKENS, *sized(state(1000)))
    name = entry_files(tmp_path)[0].name
    (disk.store.temp_folder / "w-crashed.part").write_bytes(b"\0" * 50)
    assert [f.name for f in cache(tmp_path).files()] == [name]


# --- corruption ----------------------------------------------------------------------------

META = len(b'{"scope": "tenant-a"}')
N_TOKENS = 100
HEADER_END = 96 + META + 4 * N_TOKENS
#: One offset for every class of byte in the file (see llamapy/engine/cache/disk_format.py).
BYTE_CLASSES = {
    "magic": 0, "version": 8, "meta_len": 12, "n_tokens": 16, "state_len": 24,
    "identity": 40, "body_sha256": 70, "metadata": 97, "token_ids": 96 + META + 17,
    "header_sha256": HEADER_END + 5, "state_first": HEADER_END + 32,
    "state_last": HEADER_END + 32 + 999,
}


def written(folder: Path) -> Path:
    disk = cache(folder)
    assert disk.offer(K, TOKENS, *sized(state(1000)))
    disk.close()
    (path,) = entry_files(folder)
    assert path.stat().st_size == HEADER_END + 32 + 1000
    return path


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x41
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", sorted(BYTE_CLASSES))
def test_a_corrupt_byte_anywhere_is_skipped_removed_and_warned_about(tmp_path, caplog, where):
    path = written(tmp_path)
    flip(path, BYTE_CLASSES[where])
    with caplog.at_level(logging.WARNING, logger="llamapy.engine.cache.disk"):
        disk = cache(tmp_path)
        found, _ = disk.lookup(K, TOKENS, 100)
        assert found is None or disk.read(found) is None  # header: at start; state: at read
    assert not path.exists()
    assert "removing" in caplog.text
    assert disk.lookup(K, TOKENS, 100) == (None, 0)
    assert disk.offer(K, TOKENS, *sized(state(1000)))  # and the cache works on
    disk.check_integrity()


@pytest.mark.parametrize("keep", [0, 5, 95, HEADER_END, HEADER_END + 31, HEADER_END + 500])
def test_a_truncated_file_is_removed_at_start(tmp_path, keep):
    path = written(tmp_path)
    path.write_bytes(path.read_bytes()[:keep])
    assert len(cache(tmp_path)) == 0 and not path.exists()


def test_an_extended_file_is_removed(tmp_path):
    path = written(tmp_path)
    path.write_bytes(path.read_bytes() + b"tail")
    assert len(cache(tmp_path)) == 0 and not path.exists()


def test_a_file_corrupted_after_indexing_fails_its_read_and_is_removed(tmp_path):
    path = written(tmp_path)
    disk = cache(tmp_path)
    found, _ = disk.lookup(K, TOKENS, 100)
    flip(path, BYTE_CLASSES["state_last"])
    assert disk.read(found) is None and not path.exists() and len(disk) == 0


def test_a_vanished_file_is_a_miss(tmp_path):
    path = written(tmp_path)
    disk = cache(tmp_path)
    found, _ = disk.lookup(K, TOKENS, 100)
    path.unlink()
    assert disk.read(found) is None and len(disk) == 0


def test_foreign_files(tmp_path):
    (tmp_path / ("x" + SUFFIX)).write_bytes(b"not a cache file at all")
    (tmp_path / ("v9" + SUFFIX)).write_bytes(MAGIC + (FORMAT_VERSION + 1).to_bytes(4, "little"))
    (tmp_path / "notes.txt").write_text("the user's own file")
    disk = cache(tmp_path)
    assert len(disk) == 0 and entry_files(tmp_path) == []
    assert (tmp_path / "notes.txt").exists()  # files without the suffix are left alone
    assert disk.store.num_bad_files == 2


# --- isolation -----------------------------------------------------------------------------

@pytest.mark.parametrize("other", [
    {"key": CacheKey("tenant-b", "", ())}, {"key": CacheKey(None, "", ())},
    {"key": CacheKey("tenant-a", "manifest-2", ())},
    {"key": CacheKey("tenant-a", "", (("lora.gguf", 1.0),))},
    {"namespace": CacheNamespace("model-B")},
    {"namespace": CacheNamespace("model-A", describe_adapters=lambda a: "other build")},
])
def test_another_scope_identity_adapter_set_or_model_never_reads_it(tmp_path, other):
    written(tmp_path)
    disk = cache(tmp_path, namespace=other.get("namespace", NS))
    assert len(disk) == 1  # the entry is there (and counts against the budget)...
    assert disk.lookup(other.get("key", K), TOKENS, 100) == (None, 0)  # ...but is not ours


def test_a_renamed_file_is_filed_by_its_header_not_its_name(tmp_path):
    path = written(tmp_path)
    foreign = cache(tmp_path, namespace=CacheNamespace("model-B"))
    path.rename(tmp_path / (foreign.identity(K).hex()[:32] + "-x" + SUFFIX))
    foreign.refresh(force=True)
    assert foreign.lookup(K, TOKENS, 100) == (None, 0)
