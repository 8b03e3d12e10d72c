"""What makes serialised KV valid to restore, from the host's side: file fingerprints and the
disk prompt cache's namespace digest (see :class:`~llamapy.engine.disk_cache.CacheNamespace`).

KV restored into a context is only right if the same weights, tokenizer, KV layout and
libllama computed it. The engine cannot know those; the host that loaded the model does, and
names them in one digest. Pure functions of plain values (no binding import): hosting code
(:mod:`llamapy.runtime.native`) gathers the values from the loaded model and context.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Hashable, Mapping
from typing import Any

__all__ = ["describe_adapter_files", "file_fingerprint", "namespace_digest"]

#: A GGUF file's header, metadata (tokenizer, chat template) and tensor index: all of it for
#: ordinary vocabularies.
_HEAD_BYTES = 16 << 20
_TAIL_BYTES = 1 << 20
_SAMPLES = 64
_SAMPLE_BYTES = 64 << 10

_lock = threading.Lock()
_fingerprints: dict[tuple[str, int, int, int], str] = {}


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """A sha256 over a file's size, its first 16 MiB, 64 evenly spaced 64 KiB samples and its
    last 1 MiB (the whole file when it is smaller): about 21 MiB read whatever the model's
    size, computed once per ``(realpath, size, mtime, inode)`` in a process.

    Sound for model files in practice: the head holds every metadata key (architecture,
    tokenizer, chat template) and the tensor index, and a re-quantisation or a fine-tune changes
    nearly every weight block, so the samples differ. It is not a defence against a file
    crafted to collide (whoever can write the cache folder can write a state file anyway)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_size, st.st_mtime_ns, st.st_ino)
    with _lock:
        found = _fingerprints.get(key)
    if found is None:
        found = _fingerprint(real, st.st_size)
        with _lock:
            _fingerprints[key] = found
    return found


def _fingerprint(path: str, size: int) -> str:
    digest = hashlib.sha256(f"llamapy-fingerprint-1:{size}:".encode())
    with open(path, "rb") as f:
        if size <= _HEAD_BYTES + _TAIL_BYTES + _SAMPLES * _SAMPLE_BYTES:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
            return digest.hexdigest()
        digest.update(f.read(_HEAD_BYTES))
        span = size - _HEAD_BYTES - _TAIL_BYTES - _SAMPLE_BYTES
        for i in range(_SAMPLES):
            f.seek(_HEAD_BYTES + span * i // (_SAMPLES - 1))
            digest.update(f.read(_SAMPLE_BYTES))
        f.seek(size - _TAIL_BYTES)
        digest.update(f.read(_TAIL_BYTES))
    return digest.hexdigest()


def namespace_digest(parts: Mapping[str, Any]) -> str:
    """The sha256 of the namespace parts (canonical JSON; values rendered with ``str``)."""
    text = json.dumps(dict(parts), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def describe_adapter_files(adapter_set: tuple[Hashable, ...]) -> str:
    """An adapter set of ``(path, scale)`` pairs as the adapters' fingerprints and scales (an
    adapter file replaced under the same path is another adapter). Other items: their repr."""
    out: list[Any] = []
    for item in adapter_set:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str | os.PathLike):
            path, scale = item
            try:
                out.append([file_fingerprint(path), float(scale)])
            except OSError:
                out.append(["missing", os.fspath(path), float(scale)])
        else:
            out.append(repr(item))
    return json.dumps(out)
