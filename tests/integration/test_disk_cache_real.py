"""The disk prompt cache on the real model: a restarted ``Server`` reuses a 2,000-token prefix
from disk (and answers exactly as own-slot reuse would), corrupt files of every byte class
cost a prefill and never an answer, and another scope, another context shape or another model
file never reads an entry."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llamapy.engine.cache.disk_store import SUFFIX
from llamapy.server import Server

GREEDY = {"temp": 0.0}
SIZE = {"n_ctx": 4096, "n_parallel": 1, "n_batch": 512}
FACTS = ("The tide rises twice a day. Coral grows slowly in warm water. Whales sing in long "
         "low calls. Kelp forests shelter young fish. ")


def server(model_path: Path, folder: Path, **options) -> Server:
    return Server(model_path, prompt_cache_dir=str(folder), **{**SIZE, **options}).wait_ready(60)


def prefix_ids(srv: Server, n_tokens: int) -> list[int]:
    """A ChatML system turn of about ``n_tokens`` tokens."""
    ids = srv.tokenize("<|im_start|>system\n" + FACTS * (n_tokens // 20))
    return ids[:n_tokens]


def question(srv: Server, text: str) -> list[int]:
    return srv.tokenize(f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n"
                        "<|im_start|>assistant\n", add_special=False)


def entry_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*" + SUFFIX))


def test_a_restarted_server_reuses_a_2000_token_prefix_from_disk(model_path, tmp_path):
    with server(model_path, tmp_path) as first:
        prefix = prefix_ids(first, 2000)
        prompt = prefix + question(first, "What do whales do?")
        cold = first.complete_tokens(prompt, max_tokens=8, **GREEDY)
        assert cold.timings.reused_tokens == 0
        own = first.complete_tokens(prompt, max_tokens=8, **GREEDY)  # own-slot reuse
        assert own.timings.reuse_source == "own"
    assert len(entry_files(tmp_path)) == 1  # the slot's prefix was written at close
    with server(model_path, tmp_path) as again:
        assert again.stats()["disk_cache_entries"] == 1
        warm = again.complete_tokens(prompt, max_tokens=8, **GREEDY)
        assert warm.timings.reuse_source == "disk"
        assert warm.timings.reused_tokens == len(prompt) - 1
        assert warm.token_ids == own.token_ids  # the very KV own-slot reuse had
        other = again.complete_tokens(prefix + question(again, "And kelp?"), max_tokens=4,
                                      **GREEDY)
        assert other.timings.reused_tokens >= len(prefix)  # the first request's slot, now
        stats = again.stats()
        assert stats["num_disk_restores"] == 1 and stats["num_reused_disk"] == len(prompt) - 1
        assert stats["num_disk_failures"] == 0


def small_entry(model_path: Path, folder: Path) -> tuple[list[int], list[int]]:
    """Write one entry for a 400-token prompt; returns the prompt and its cold answer."""
    with server(model_path, folder) as srv:
        prompt = prefix_ids(srv, 400) + question(srv, "What grows slowly?")
        cold = srv.complete_tokens(prompt, max_tokens=6, **GREEDY)
    return prompt, list(cold.token_ids)


def _offsets(path: Path) -> dict[str, int]:
    """An offset in each byte class of the file (see llamapy/engine/cache/disk_format.py)."""
    data = path.read_bytes()
    meta_len = int.from_bytes(data[12:16], "little")
    n_tokens = int.from_bytes(data[16:24], "little")
    header_end = 96 + meta_len + 4 * n_tokens
    return {"magic": 1, "version": 8, "lengths": 20, "identity": 33, "body_checksum": 80,
            "metadata": 97, "token_ids": 96 + meta_len + 9, "header_checksum": header_end + 3,
            "body": header_end + 32 + (len(data) - header_end - 32) // 2}


@pytest.fixture(scope="module")
def written(model_path, tmp_path_factory) -> tuple[Path, list[int], list[int]]:
    folder = tmp_path_factory.mktemp("disk-written")
    prompt, cold = small_entry(model_path, folder)
    return folder, prompt, cold


@pytest.mark.parametrize("where", ["magic", "version", "lengths", "identity", "metadata",
                                   "token_ids", "header_checksum", "body_checksum", "body",
                                   "truncated"])
def test_a_corrupt_file_costs_a_prefill_not_an_answer(model_path, tmp_path, written, where):
    folder, prompt, cold = written
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    (path,) = entry_files(tmp_path)
    data = bytearray(path.read_bytes())
    if where == "truncated":
        del data[len(data) // 2:]
    else:
        data[_offsets(path)[where]] ^= 0x5A
    path.write_bytes(bytes(data))
    with server(model_path, tmp_path) as srv:
        answer = srv.complete_tokens(prompt, max_tokens=6, **GREEDY)
        assert answer.timings.reuse_source is None  # nothing read, nothing reused
        assert list(answer.token_ids) == cold       # and the answer is the cold answer
        stats = srv.stats()
        assert stats["disk_cache_bad_files"] + stats["num_disk_failures"] == 1
        assert not path.exists()  # removed (at close this run writes its own entry)
    assert len(entry_files(tmp_path)) == 1


def test_another_scope_never_reads_the_entry(model_path, tmp_path):
    with server(model_path, tmp_path) as srv:
        prompt = prefix_ids(srv, 400) + question(srv, "What grows slowly?")
        srv.complete_tokens(prompt, max_tokens=2, cache_scope="tenant-a", **GREEDY)
    with server(model_path, tmp_path) as srv:
        other = srv.complete_tokens(prompt, max_tokens=2, cache_scope="tenant-b", **GREEDY)
        shared = srv.complete_tokens([*prompt, 28], max_tokens=2, **GREEDY)  # the None scope
        own = srv.complete_tokens(prompt, max_tokens=2, cache_scope="tenant-a", **GREEDY)
    assert other.timings.reused_tokens == 0 and shared.timings.reused_tokens == 0
    assert own.timings.reuse_source == "disk"


@pytest.mark.parametrize("change", [{"type_k": "q8_0"}, {"n_ctx": 2048}])
def test_another_context_shape_never_reads_the_entry(model_path, tmp_path, change):
    prompt, _ = small_entry(model_path, tmp_path)
    with server(model_path, tmp_path, **change) as srv:
        answer = srv.complete_tokens(prompt, max_tokens=6, **GREEDY)
        assert answer.timings.reuse_source is None
        assert srv.stats()["disk_cache_bad_files"] == 0  # not corrupt: someone else's
    assert len(entry_files(tmp_path)) == 2  # theirs is kept, ours is added


def test_another_model_file_never_reads_the_entry_a_copy_does(model_path, tmp_path):
    folder = tmp_path / "cache"
    prompt, cold = small_entry(model_path, folder)
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(model_path, copy)
    with server(copy, folder) as srv:  # the same bytes elsewhere: the same model
        assert srv.complete_tokens(prompt, max_tokens=6, **GREEDY).timings.reuse_source \
            == "disk"
    other = tmp_path / "other.gguf"
    data = bytearray(model_path.read_bytes())
    key = data.index(b"general.name", 0, 1 << 16)  # a metadata string: still a valid model
    data[key + len(b"general.name") + 12] ^= 0x20  # its value's first letter (type, length)
    other.write_bytes(bytes(data))
    with server(other, folder) as srv:
        answer = srv.complete_tokens(prompt, max_tokens=6, **GREEDY)
    assert answer.timings.reuse_source is None and list(answer.token_ids) == cold
