"""The key/value metadata of a GGUF file's header, read without loading the model.

Reads the header of GGUF versions 2 and 3: the magic, the version, the tensor count and the
key/value pairs. Scalars and strings are returned as they are; an array is summarised as
``{"array": TYPE, "count": N}`` (a vocabulary has tens of thousands of entries). Every length is
bounded (:data:`MAX_KV`, :data:`MAX_STRING`), so a truncated or hostile file raises
:class:`~llamapy.errors.InvalidOptionError` instead of reading without end.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import InvalidOptionError

__all__ = ["MAX_KV", "MAX_STRING", "SUMMARY_KEYS", "read_gguf_metadata", "summary"]

#: The most key/value pairs read from one header.
MAX_KV = 1 << 16
#: The longest string read (a chat template is at most a few hundred KB).
MAX_STRING = 1 << 24
#: Keys shown by ``python -m llamapy show`` (``{arch}`` is ``general.architecture``).
SUMMARY_KEYS = ("general.architecture", "general.name", "general.size_label",
                "general.file_type", "{arch}.context_length", "{arch}.embedding_length",
                "{arch}.block_count", "{arch}.attention.head_count", "tokenizer.ggml.model")

#: GGUF value type -> struct format of a scalar (8: string, 9: array are read apart).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32",
               6: "float32", 7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64",
               12: "float64"}


def _bad(path: Path, what: str) -> InvalidOptionError:
    return InvalidOptionError(f"{path}: not a readable GGUF header ({what})", option="model")


class _Reader:
    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f = f
        self.path = path

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise _bad(self.path, "truncated")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > MAX_STRING:
            raise _bad(self.path, f"a string of {n} bytes")
        data = self.f.read(n)
        if len(data) != n:
            raise _bad(self.path, "truncated")
        return data.decode("utf-8", errors="replace")

    def value(self, kind: int, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind == 9 and depth == 0:
            item, count = self.unpack("<I"), self.unpack("<Q")
            self.skip(item, count)
            return {"array": _TYPE_NAMES.get(item, str(item)), "count": count}
        raise _bad(self.path, f"value type {kind}")

    def skip(self, item: int, count: int) -> None:
        if item in _SCALARS:
            self.f.seek(struct.calcsize(_SCALARS[item]) * count, 1)
            return
        for _ in range(count):
            if item == 8:
                self.f.seek(self.unpack("<Q"), 1)
            else:
                self.value(item, depth=1)


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """The header's key/value pairs plus ``gguf.version`` and ``gguf.tensor_count``."""
    with open(path, "rb") as f:
        reader = _Reader(f, path)
        if f.read(4) != b"GGUF":
            raise _bad(path, "no GGUF magic")
        version = reader.unpack("<I")
        if version not in (2, 3):
            raise _bad(path, f"version {version}")
        tensors, count = reader.unpack("<Q"), reader.unpack("<Q")
        if count > MAX_KV:
            raise _bad(path, f"{count} key/value pairs")
        meta: dict[str, Any] = {"gguf.version": version, "gguf.tensor_count": tensors}
        for _ in range(count):
            key = reader.string()
            meta[key] = reader.value(reader.unpack("<I"))
    return meta


def summary(meta: dict[str, Any]) -> dict[str, Any]:
    """The :data:`SUMMARY_KEYS` present in ``meta``."""
    arch = str(meta.get("general.architecture", ""))
    keys = [k.replace("{arch}", arch) for k in SUMMARY_KEYS]
    return {k: meta[k] for k in ["gguf.tensor_count", *keys] if k in meta}
