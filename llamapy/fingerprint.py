"""One fingerprint per model file: the sha256 of its bytes, computed once, off the caller's thread.

A session's manifest (``model_digest``), the disk prompt cache's namespace and the slot files of
``python -m llamapy.serve`` all name a model (and adapters, and libllama's file) by
:func:`model_fingerprint`. It is memoized per ``(realpath, size, mtime_ns, inode)`` for the life
of the process, so a file replaced or rewritten in place is hashed again, and a copy of the
same bytes has the same fingerprint. Concurrent callers for one file share one computation.

Hashing a large model takes seconds (about 1 GB/s), so loading a model starts it in the
background (:func:`start_fingerprint`, called by ``Model``): whoever needs the fingerprint
first waits only for what is left of it.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import Future

__all__ = ["model_fingerprint", "start_fingerprint"]

#: A file version: its real path, size, modification time (ns) and inode.
_Key = tuple[str, int, int, int]

_lock = threading.Lock()
_known: dict[_Key, Future[str]] = {}
_BLOCK = 1 << 22


def _key_of(path: str | os.PathLike[str]) -> _Key:
    real = os.path.realpath(path)
    st = os.stat(real)
    return (real, st.st_size, st.st_mtime_ns, st.st_ino)


def _claim(path: str | os.PathLike[str]) -> tuple[_Key, Future[str], bool]:
    """The future of ``path``'s current version and whether the caller must compute it (the
    first to ask). Older versions of the same path are forgotten."""
    key = _key_of(path)
    with _lock:
        found = _known.get(key)
        if found is not None:
            return key, found, False
        for old in [k for k in _known if k[0] == key[0]]:
            del _known[old]
        future: Future[str] = Future()
        _known[key] = future
        return key, future, True


def _compute(key: _Key, future: Future[str]) -> None:
    """Hash the file of ``key`` into ``future``. A failed read is forgotten (the next caller
    tries again), and so is a file that changed while it was read (its digest is returned
    once, to the callers that asked before the change)."""
    try:
        digest = hashlib.sha256()
        with open(key[0], "rb") as f:
            for block in iter(lambda: f.read(_BLOCK), b""):
                digest.update(block)
        if _key_of(key[0]) != key:
            _forget(key)
        future.set_result(digest.hexdigest())
    except BaseException as exc:
        _forget(key)
        future.set_exception(exc)
        if not isinstance(exc, Exception):
            raise


def _forget(key: _Key) -> None:
    with _lock:
        _known.pop(key, None)


def model_fingerprint(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of the file at ``path`` (a model, an adapter, any file), computed once per
    version of the file in this process; waits for a computation already under way. Raises
    ``OSError`` when the file cannot be read."""
    key, future, mine = _claim(path)
    if mine:
        _compute(key, future)
    return future.result()


def start_fingerprint(path: str | os.PathLike[str]) -> Future[str]:
    """Start computing :func:`model_fingerprint` of ``path`` on a daemon thread (unless it is
    known or under way) and return its future. A missing file gives a failed future."""
    try:
        key, future, mine = _claim(path)
    except OSError as exc:
        failed: Future[str] = Future()
        failed.set_exception(exc)
        return failed
    if mine:
        threading.Thread(target=_compute, args=(key, future), name="llamapy-fingerprint",
                         daemon=True).start()
    return future
