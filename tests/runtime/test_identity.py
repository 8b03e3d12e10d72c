"""The disk cache namespace's pure parts: adapter descriptions and the digest (no model). The
file fingerprint itself is tested in ``tests/test_model_fingerprint.py``."""

from __future__ import annotations

import os

from llamapy.runtime.identity import describe_adapter_files, namespace_digest

MIB = 1 << 20


def write(path, size: int, patch: dict[int, bytes] | None = None) -> None:
    """A sparse file of ``size`` zero bytes with ``patch`` written at its offsets."""
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, data in (patch or {}).items():
            f.seek(offset)
            f.write(data)


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
