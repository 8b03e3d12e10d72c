"""The file format of the disk prompt cache (:mod:`llamapy.engine.cache.disk`).

One file per entry, version 1, integers little-endian::

    offset        size  field
    0             8     magic  b"LPYPKV\\x00\\x01"
    8             4     u32    format version (1)
    12            4     u32    metadata length M
    16            8     u64    token count T
    24            8     u64    state length S
    32            32    identity: sha256 of (namespace, cache_scope, cache_identity, adapters,
                        tenant, salt digest)
    64            32    body sha256: of the token ids and the state bytes
    96            M     UTF-8 JSON metadata: ``{"scope": cache_scope, "tenant": tenant,
                        "media": runs}`` (``"tenant"`` only for a tenant other than the
                        default, None; ``"media"`` only when the tokens hold media)
    96+M          4T    token ids (u32; 0xFFFFFFFF where a media token id stands)
    96+M+4T       32    header sha256: of bytes [0, 96+M+4T)
    128+M+4T      S     state bytes (``Backend.state_seq_get``)

Media token ids (negative, see :mod:`llamapy.engine.media`) do not fit a u32: the metadata
lists them as runs ``[index, first id, length]`` of consecutive ids (each next id one less),
and the token array holds a placeholder there. The body checksum and the file name hash the
runs too (:func:`token_digest_bytes`), so entries that differ only in their media differ.

The *header* (everything before the state) is small: the index is rebuilt from headers alone
(the tenant in the metadata charges the entry to its tenant's share of the budget), and the
header checksum guards the identity, the metadata, the token ids and the body checksum. The body
checksum is verified when the state is read. :func:`read_header` and :func:`read_state` raise
:class:`~llamapy.errors.DiskCacheFormatError` for a wrong magic or version, lengths that do not
add up to the file's size (a truncated or extended file), malformed metadata or a checksum
mismatch; nothing in a file is trusted before its checksum is.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from llamapy.errors import DiskCacheFormatError

if TYPE_CHECKING:
    from llamapy.engine.request import CacheKey

__all__ = ["FORMAT_VERSION", "MAGIC", "CacheNamespace", "EntryHeader", "blob_identity",
           "encode_entry", "entry_identity", "file_size", "media_runs", "read_header",
           "read_state", "token_bytes", "token_digest_bytes"]

MAGIC = b"LPYPKV\x00\x01"
#: The u32 written where a media token id stands (its id is in the metadata's runs).
MEDIA_PLACEHOLDER = 0xFFFFFFFF
FORMAT_VERSION = 1
_FIXED = struct.Struct("<8sIIQQ32s32s")
_DIGEST = 32
#: Headers larger than this are refused before they are read (a corrupt length field).
_MAX_META = 1 << 16
_MAX_TOKENS = 1 << 26


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """A verified header: who may read the entry, its tokens, and where its state lies."""

    identity: bytes
    scope: str | None
    token_ids: tuple[int, ...]
    state_len: int
    body_sha256: bytes
    state_offset: int
    tenant: str | None = None

    @property
    def file_size(self) -> int:
        """The exact size of the whole file."""
        return self.state_offset + self.state_len


def media_runs(token_ids: Sequence[int]) -> list[list[int]]:
    """The media token ids of ``token_ids`` as runs ``[index, first id, length]``."""
    runs: list[list[int]] = []
    if not token_ids or min(token_ids) >= 0:
        return runs
    for i, t in enumerate(token_ids):
        if t >= 0:
            continue
        last = runs[-1] if runs else None
        if last is not None and last[0] + last[2] == i and last[1] - last[2] == t:
            last[2] += 1
        else:
            runs.append([i, t, 1])
    return runs


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian u32 (:data:`MEDIA_PLACEHOLDER` for a media token id)."""
    if token_ids and min(token_ids) < 0:
        token_ids = [t if t >= 0 else MEDIA_PLACEHOLDER for t in token_ids]
    arr = array("I", token_ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def token_digest_bytes(token_ids: Sequence[int]) -> bytes:
    """What checksums and file names hash of ``token_ids``: :func:`token_bytes`, then the
    media runs (nothing more without media, so entries written before media keep theirs)."""
    runs = media_runs(token_ids)
    return token_bytes(token_ids) + (json.dumps(runs).encode() if runs else b"")


def _meta(scope: str | None, tenant: str | None, runs: list[list[int]] | None = None) -> bytes:
    fields: dict[str, object] = {"scope": scope}
    if tenant is not None:
        fields["tenant"] = tenant
    if runs:
        fields["media"] = runs
    return json.dumps(fields, sort_keys=True).encode()


def file_size(scope: str | None, n_tokens: int, state_len: int,
              tenant: str | None = None, runs: list[list[int]] | None = None) -> int:
    """The size of an entry's file, computed before its state is serialised (``runs``: the
    tokens' :func:`media_runs`)."""
    return _FIXED.size + len(_meta(scope, tenant, runs)) + 4 * n_tokens + _DIGEST + state_len


def encode_entry(identity: bytes, scope: str | None, token_ids: Sequence[int],
                 state: bytes, tenant: str | None = None) -> list[bytes]:
    """An entry's file as chunks (written in order; the state is not copied)."""
    tokens, meta = token_bytes(token_ids), _meta(scope, tenant, media_runs(token_ids))
    body = hashlib.sha256(token_digest_bytes(token_ids))
    body.update(state)
    fixed = _FIXED.pack(MAGIC, FORMAT_VERSION, len(meta), len(token_ids), len(state), identity,
                        body.digest())
    header = fixed + meta + tokens
    return [header, hashlib.sha256(header).digest(), state]


def read_header(f: BinaryIO, size: int) -> EntryHeader:
    """Read and verify the header of a file of ``size`` bytes (the state is not read)."""
    fixed = f.read(_FIXED.size)
    if len(fixed) < _FIXED.size:
        raise DiskCacheFormatError("truncated header")
    magic, version, meta_len, n_tokens, state_len, identity, body = _FIXED.unpack(fixed)
    if magic != MAGIC:
        raise DiskCacheFormatError("not a llamapy prompt cache file (bad magic)")
    if version != FORMAT_VERSION:
        raise DiskCacheFormatError(f"unsupported format version {version}")
    if meta_len > _MAX_META or n_tokens > _MAX_TOKENS:
        raise DiskCacheFormatError("implausible header lengths")
    rest_len = meta_len + 4 * n_tokens
    if _FIXED.size + rest_len + _DIGEST + state_len != size:
        raise DiskCacheFormatError("lengths do not match the file size (truncated?)")
    rest = f.read(rest_len)
    digest = f.read(_DIGEST)
    if len(rest) != rest_len or hashlib.sha256(fixed + rest).digest() != digest:
        raise DiskCacheFormatError("header checksum mismatch")
    scope, tenant, runs = _meta_fields(rest[:meta_len])
    tokens = array("I")
    tokens.frombytes(rest[meta_len:])
    if sys.byteorder != "little":
        tokens.byteswap()
    return EntryHeader(identity, scope, _with_media(tokens, runs), state_len, body,
                       _FIXED.size + rest_len + _DIGEST, tenant)


def _meta_fields(meta: bytes) -> tuple[str | None, str | None, list[list[int]]]:
    """``(scope, tenant, media runs)`` of the metadata (no ``"tenant"``: the default tenant,
    None)."""
    try:
        fields = json.loads(meta)
        scope, tenant, runs = fields["scope"], fields.get("tenant"), fields.get("media", [])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DiskCacheFormatError("malformed metadata") from exc
    if any(v is not None and not isinstance(v, str) for v in (scope, tenant)) or \
            not isinstance(runs, list) or not all(_is_run(r) for r in runs):
        raise DiskCacheFormatError("malformed metadata")
    return scope, tenant, runs


def _is_run(run: object) -> bool:
    return (isinstance(run, list) and len(run) == 3
            and all(type(v) is int for v in run)
            and run[0] >= 0 and run[2] > 0 and run[1] < 0 and run[1] - run[2] >= -(1 << 63))


def _with_media(tokens: array[int], runs: list[list[int]]) -> tuple[int, ...]:
    """The token ids with each media run's ids put back over its placeholders."""
    out = list(tokens)
    for index, first, n in runs:
        if index + n > len(out) or any(t != MEDIA_PLACEHOLDER for t in out[index:index + n]):
            raise DiskCacheFormatError("media runs do not match the token ids")
        out[index:index + n] = range(first, first - n, -1)
    if MEDIA_PLACEHOLDER in out:
        raise DiskCacheFormatError("a placeholder without a media run")
    return tuple(out)


def read_state(f: BinaryIO, header: EntryHeader) -> bytes:
    """Read the state that follows ``header`` and verify the body checksum."""
    f.seek(header.state_offset)
    state = f.read(header.state_len)
    if len(state) != header.state_len:
        raise DiskCacheFormatError("truncated state")
    body = hashlib.sha256(token_digest_bytes(header.token_ids))
    body.update(state)
    if body.digest() != header.body_sha256:
        raise DiskCacheFormatError("body checksum mismatch")
    return state


@dataclass(frozen=True, slots=True)
class CacheNamespace:
    """What the host knows and the engine does not: ``digest`` names the model and runtime
    the KV was computed by; ``describe_adapters`` turns an adapter set into something that
    changes when an adapter file does (default ``repr``)."""

    digest: str
    describe_adapters: Callable[[tuple[Hashable, ...]], str] = repr


def entry_identity(namespace: CacheNamespace, key: CacheKey) -> bytes:
    """The identity of the entries filed under ``key`` (header field ``identity``)."""
    adapters = namespace.describe_adapters(tuple(key.adapter_set))
    fields = ["llamapy-prompt-cache", namespace.digest, key.cache_scope, key.cache_identity,
              adapters]
    if key.tenant is not None or key.salt is not None:  # unset: identities as before
        fields += [key.tenant, key.salt]
    payload = json.dumps(fields)
    return hashlib.sha256(payload.encode()).digest()


def blob_identity(name: str) -> bytes:
    """The identity of the named blob ``name`` (a session snapshot)."""
    return hashlib.sha256(json.dumps(["llamapy-blob", name]).encode()).digest()
