"""One fingerprint per model file: the sha256 of its bytes, computed once, off the caller's thread.

A session's manifest (``model_digest``), the disk prompt cache's namespace and the slot files of
``python -m llamapy.serve`` all name a model (and adapters, and libllama's file) by
:func:`model_fingerprint`. It is memoized per ``(realpath, size, mtime_ns, inode)`` for the life
of the process, so a file replaced or rewritten in place is hashed again, and a copy of the
same bytes has the same fingerprint. Concurrent callers for one file share one computation.

Hashing a large model takes seconds (about 1 GB/s), so a server starts it in the background a
moment after its model is ready (:func:`start_fingerprint` with a delay), at idle priority:
neither the start (hashing while the weights loaded added ~0.07 s to a 2-core start) nor its
first requests share the CPU with it. A caller that needs the fingerprint while the background
hash is under way does not wait for it: it hashes on its own thread, at its own priority, and
whichever finishes first gives the result (the other stops at its next block).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from concurrent.futures import Future

__all__ = ["model_fingerprint", "start_fingerprint"]

#: A file version: its real path, size, modification time (ns) and inode.
_Key = tuple[str, int, int, int]

_lock = threading.Lock()
_known: dict[_Key, Future[str]] = {}
#: Versions hashed by a background thread at idle priority (callers do not wait for those).
_background: set[_Key] = set()
_BLOCK = 1 << 24


def _key_of(path: str | os.PathLike[str]) -> _Key:
    real = os.path.realpath(path)
    st = os.stat(real)
    return (real, st.st_size, st.st_mtime_ns, st.st_ino)


def _claim(path: str | os.PathLike[str], background: bool = False
           ) -> tuple[_Key, Future[str], bool]:
    """The future of ``path``'s current version and whether the caller must compute it (the
    first to ask; ``background``: it will, on a background thread). Older versions of the same
    path are forgotten."""
    key = _key_of(path)
    with _lock:
        found = _known.get(key)
        if found is not None:
            return key, found, False
        for old in [k for k in _known if k[0] == key[0]]:
            del _known[old]
        future: Future[str] = Future()
        _known[key] = future
        if background:
            _background.add(key)
        return key, future, True


def _compute(key: _Key, future: Future[str]) -> None:
    """Hash the file of ``key`` into ``future``, unless another computation settles it first
    (checked between blocks). A failed read is forgotten (the next caller tries again), and so
    is a file that changed while it was read (its digest is returned once, to the callers that
    asked before the change)."""
    try:
        digest = hashlib.sha256()
        buffer = bytearray(_BLOCK)
        view = memoryview(buffer)
        with open(key[0], "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                if future.done():
                    return
                digest.update(view[:n])
        if _key_of(key[0]) != key:
            _forget(key)
        _settle(future, digest.hexdigest())
    except BaseException as exc:
        _forget(key)
        _settle(future, error=exc)
        if not isinstance(exc, Exception):
            raise


def _settle(future: Future[str], digest: str = "", error: BaseException | None = None) -> None:
    """Give ``future`` its result (or ``error``) unless a racing computation already did."""
    with _lock:
        if future.done():
            return
        if error is None:
            future.set_result(digest)
        else:
            future.set_exception(error)


def _compute_in_background(key: _Key, future: Future[str]) -> None:
    """:func:`_compute` on this thread at idle priority."""
    try:
        _lower_priority()
        _compute(key, future)
    finally:
        with _lock:
            _background.discard(key)


def _lower_priority() -> None:
    """Let the calling thread run only on CPU nothing else wants: Linux's ``SCHED_IDLE`` (or
    else its nicest value); best effort, and nothing elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, 19)


def _forget(key: _Key) -> None:
    with _lock:
        _known.pop(key, None)


def model_fingerprint(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of the file at ``path`` (a model, an adapter, any file), computed once per
    version of the file in this process; waits for a computation already under way, but hashes
    itself rather than wait for a background one. Raises ``OSError`` when the file cannot be
    read."""
    key, future, mine = _claim(path)
    with _lock:
        racing = not mine and key in _background and not future.done()
    if mine or racing:
        _compute(key, future)
    return future.result()


def start_fingerprint(path: str | os.PathLike[str], delay: float = 0.0) -> Future[str] | None:
    """Start computing :func:`model_fingerprint` of ``path`` on a daemon thread at idle
    priority (unless it is known or under way) and return its future; a missing file gives a
    failed future. ``delay`` > 0: start it that many seconds from now instead (a blocked timer
    thread; None is returned), so it does not share the CPU with what runs meanwhile."""
    if delay > 0:
        timer = threading.Timer(delay, start_fingerprint, args=(path,))
        timer.daemon = True
        timer.start()
        return None
    try:
        key, future, mine = _claim(path, background=True)
    except OSError as exc:
        failed: Future[str] = Future()
        failed.set_exception(exc)
        return failed
    if mine:
        threading.Thread(target=_compute_in_background, args=(key, future),
                         name="llamapy-fingerprint", daemon=True).start()
    return future
