"""The disk cache namespace's pure parts: file fingerprints and adapter descriptions (no model)."""

from __future__ import annotations

import os

from llamapy.runtime.identity import describe_adapter_files, file_fingerprint, namespace_digest

MIB = 1 << 20


def write(path, size: int, patch: dict[int, bytes] | None = None) -> None:
    """A sparse file of ``size`` zero bytes with ``patch`` written at its offsets."""
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, data in (patch or {}).items():
            f.seek(offset)
            f.write(data)


def test_small_files_are_hashed_whole(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write(a, 3 * MIB)
    write(b, 3 * MIB, {3 * MIB - 1: b"x"})
    assert file_fingerprint(a) != file_fingerprint(b)
    assert file_fingerprint(a) == file_fingerprint(a)


def test_large_files_are_sampled_head_spread_and_tail(tmp_path):
    size = 200 * MIB
    base = tmp_path / "base"
    write(base, size)
    digests = {file_fingerprint(base)}
    for name, offset in (("head", 5 * MIB), ("tail", size - 10), ("sample", 16 * MIB)):
        path = tmp_path / name
        write(path, size, {offset: b"changed"})
        digests.add(file_fingerprint(path))
    assert len(digests) == 4
    longer = tmp_path / "longer"
    write(longer, size + 1)
    assert file_fingerprint(longer) not in digests  # the size is part of it


def test_a_copy_has_the_same_fingerprint_and_a_rewrite_is_noticed(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write(a, 2 * MIB, {10: b"model"})
    write(b, 2 * MIB, {10: b"model"})
    assert file_fingerprint(a) == file_fingerprint(b)  # content, not path
    first = file_fingerprint(a)
    write(a, 2 * MIB, {10: b"other"})
    os.utime(a, ns=(1, 1))  # a new mtime: the cached fingerprint is not reused
    assert file_fingerprint(a) != first


def test_adapters_are_described_by_their_files(tmp_path):
    lora = tmp_path / "a.gguf"
    write(lora, MIB, {0: b"one"})
    first = describe_adapter_files(((str(lora), 1.0),))
    assert first != describe_adapter_files(((str(lora), 0.5),))
    write(lora, MIB, {0: b"two"})
    os.utime(lora, ns=(2, 2))
    assert describe_adapter_files(((str(lora), 1.0),)) != first
    assert "missing" in describe_adapter_files(((str(tmp_path / "gone.gguf"), 1.0),))
    assert describe_adapter_files(()) == "[]"


def test_namespace_digest_is_canonical():
    assert namespace_digest({"a": 1, "b": [2]}) == namespace_digest({"b": [2], "a": 1})
    assert namespace_digest({"a": 1}) != namespace_digest({"a": 2})
