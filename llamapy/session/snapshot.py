"""``SessionSnapshot`` and its file format.

File format, version 1 (all integers little-endian)::

    offset  size  field
    0       8     magic  b"LPYSNAP\\x00"
    8       4     u32    format version (1)
    12      8     u64    metadata length M
    20      M     UTF-8 JSON metadata: manifest (ContextManifest.to_dict), token_ids,
                  kv_tokens, prefix_tokens, suffix_tokens, n_ctx
    20+M    8     u64    state length S
    28+M    S     state bytes (llama_state_seq_get_data of the session's sequence)
    28+M+S  32    sha256 of bytes [0, 28+M+S)

``load`` refuses a wrong magic, an unknown version, a truncated file or a bad checksum with
:class:`SnapshotFormatError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from llamapy.errors import SnapshotFormatError
from llamapy.session.manifest import ContextManifest

__all__ = ["SNAPSHOT_MAGIC", "SNAPSHOT_VERSION", "SessionSnapshot"]

SNAPSHOT_MAGIC = b"LPYSNAP\x00"
SNAPSHOT_VERSION = 1
_HEAD = struct.Struct("<8sIQ")
_LEN = struct.Struct("<Q")


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionSnapshot:
    """A session's resident state: ``state`` holds the KV of ``token_ids[:kv_tokens]`` (the
    last generated token may not be in the KV yet); ``token_ids`` is prefix, suffix and
    generated tokens, split by ``prefix_tokens`` / ``suffix_tokens``."""

    state: bytes
    token_ids: tuple[int, ...]
    kv_tokens: int
    prefix_tokens: int
    suffix_tokens: int
    n_ctx: int
    manifest: ContextManifest

    def _metadata(self) -> bytes:
        meta = {
            "manifest": self.manifest.to_dict(), "token_ids": list(self.token_ids),
            "kv_tokens": self.kv_tokens, "prefix_tokens": self.prefix_tokens,
            "suffix_tokens": self.suffix_tokens, "n_ctx": self.n_ctx,
        }
        return json.dumps(meta, sort_keys=True).encode()

    def to_bytes(self) -> bytes:
        """The file format as bytes."""
        meta = self._metadata()
        body = b"".join([_HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, len(meta)), meta,
                         _LEN.pack(len(self.state)), self.state])
        return body + hashlib.sha256(body).digest()

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionSnapshot:
        """Parse and verify the file format."""
        if len(data) < _HEAD.size + _LEN.size + 32:
            raise SnapshotFormatError("snapshot truncated")
        magic, version, meta_len = _HEAD.unpack_from(data, 0)
        if magic != SNAPSHOT_MAGIC:
            raise SnapshotFormatError("not a llamapy session snapshot (bad magic)")
        if version != SNAPSHOT_VERSION:
            raise SnapshotFormatError(f"unsupported snapshot version {version}")
        body, digest = data[:-32], data[-32:]
        if hashlib.sha256(body).digest() != digest:
            raise SnapshotFormatError("snapshot checksum mismatch")
        at = _HEAD.size + meta_len
        if at + _LEN.size > len(body):
            raise SnapshotFormatError("snapshot truncated")
        (state_len,) = _LEN.unpack_from(body, at)
        state = body[at + _LEN.size:]
        if len(state) != state_len:
            raise SnapshotFormatError("snapshot state length mismatch")
        meta = json.loads(body[_HEAD.size:at])
        return cls(state=bytes(state), token_ids=tuple(meta["token_ids"]),
                   kv_tokens=int(meta["kv_tokens"]), prefix_tokens=int(meta["prefix_tokens"]),
                   suffix_tokens=int(meta["suffix_tokens"]), n_ctx=int(meta["n_ctx"]),
                   manifest=ContextManifest.from_dict(meta["manifest"]))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the snapshot atomically (temp file + rename)."""
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(self.to_bytes())
        os.replace(tmp, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SessionSnapshot:
        """Read and verify a snapshot file."""
        return cls.from_bytes(Path(path).read_bytes())
