"""The folder of the disk prompt cache: its lock, its files and how they are scanned.

What this module guarantees, for any number of processes sharing one folder:

- **Atomic files**: an entry is written to a temp file in ``<folder>/.tmp`` and moved into the
  folder with ``os.replace``; a reader sees a whole file or none. (Not fsynced: after a power
  loss a file may be short or empty, and its checksum removes it.)
- **One mutator at a time**: every change to the folder (commit, eviction, removal) happens
  under :meth:`DiskStore.lock`, an ``fcntl.flock`` on ``<folder>/.lock`` (plus a thread lock,
  since ``flock`` does not exclude threads sharing a descriptor; without ``fcntl``, on
  Windows, only the thread lock: one process per folder there). Readers take no lock: a file
  that vanishes is a miss, and one opened before its removal stays readable.
- **Exact change detection**: every lock holder that changes the folder adds one to a
  generation count kept in ``.lock``, so an instance knows whether the folder is as it last
  saw it by reading 8 bytes and the folder's mtime (:meth:`DiskStore.changed`), and the holder
  of the lock, when it was, keeps its view by what it does itself: no rescan of every file
  after its own writes. (The mtime catches other tools, e.g. a user's ``rm``, except within
  the same clock tick as our own change; such a file vanishes as a miss when read.)
- **Nothing foreign is trusted**: :meth:`DiskStore.scan` reads headers only
  (:func:`~llamapy.engine.cache.disk_format.read_header`); a file with our suffix whose header is
  corrupt, truncated, of another version or not ours at all is removed with a warning (only if
  it is still the file that was read: same inode). Files without the suffix are left alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamapy.engine.cache.checkpoints import read_positions
from llamapy.engine.cache.disk_format import (
    EntryHeader,
    read_header,
    read_state,
    token_digest_bytes,
)
from llamapy.errors import DiskCacheFormatError

try:
    import fcntl
except ImportError:  # Windows: one process per folder (the thread lock still holds)
    fcntl = None  # type: ignore[assignment]

__all__ = ["SUFFIX", "DiskStore", "StoredFile", "entry_name"]

log = logging.getLogger("llamapy.engine.cache.disk")

SUFFIX = ".lpkv"
#: Temp files older than this are left over from a crash (a write takes seconds at most).
_STALE_TEMP_S = 3600.0
#: How often a writer that does not rescan still sweeps stale temp files.
_SWEEP_S = 600.0


def entry_name(identity: bytes, token_ids: Sequence[int]) -> str:
    """``<identity>-<token hash>.lpkv``: one file per identity and token sequence."""
    tokens = hashlib.sha256(token_digest_bytes(token_ids)).hexdigest()[:32]
    return f"{identity.hex()[:32]}-{tokens}{SUFFIX}"


@dataclass(slots=True, eq=False)
class StoredFile:
    """One entry file: its name, verified header, size, inode and last use (``mtime_ns``),
    and the positions of the context checkpoints packed with its state (read with the header,
    so the cache can choose among files before reading one; verified with the state)."""

    name: str
    header: EntryHeader
    size: int
    inode: int
    mtime_ns: int
    checkpoints: tuple[int, ...] = ()


class DiskStore:
    """The cache folder (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder).expanduser()
        self.temp_folder = self.folder / ".tmp"
        self.temp_folder.mkdir(parents=True, exist_ok=True)
        self._thread_lock = threading.Lock()
        self._lock_fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        self.num_bad_files = 0
        self._last_stamp = 0
        #: (generation, folder mtime) when this instance's view was last complete; None: never.
        self._seen: tuple[int, int] | None = None
        self._held: tuple[int, int] = (0, 0)  # the version when the lock was taken
        self._mutated = self._scanned = False
        self._fd_io = threading.Lock()
        self._swept_at = -_SWEEP_S

    def close(self) -> None:
        """Close the lock file; idempotent."""
        with self._thread_lock:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    @contextlib.contextmanager
    def lock(self) -> Iterator[bool]:
        """Exclusive use of the folder, across threads and processes. Yields whether the folder
        is as this instance last saw it: then the caller keeps its view current with what it
        does under the lock, and the folder counts as seen at release (as after a
        :meth:`scan` under the lock). A change under the lock moves the generation."""
        with self._thread_lock:
            if self._lock_fd < 0:
                raise OSError("disk prompt cache: the store is closed")
            if fcntl is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                self._held = self.version()
                fresh = self._held == self._seen
                self._mutated = self._scanned = False
                completed = False
                try:
                    yield fresh
                    completed = True
                finally:
                    self._seen = None
                    if completed and (fresh or self._scanned):
                        self._seen = self.version()
            finally:
                if fcntl is not None:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def committing(self, tmp: Path, name: str, last_used_ns: int | None = None
                   ) -> Iterator[bool]:
        """:meth:`lock`, with the written temp file ``tmp`` moved into place as ``name`` (see
        :meth:`commit`) first; the temp file is removed if it never got there."""
        try:
            with self.lock() as fresh:
                self.commit(tmp, name, last_used_ns)
                yield fresh
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _mutating(self) -> None:
        """Move the generation, once a lock, before the folder changes (should the process
        die half-way, the others still see a change)."""
        if not self._mutated:
            self._mutated = True
            self._count(self._held[0] + 1)

    def path(self, name: str) -> Path:
        """The path of an entry file."""
        return self.folder / name

    def version(self) -> tuple[int, int]:
        """The folder's generation count and mtime."""
        return self._count(), os.stat(self.folder).st_mtime_ns

    def _count(self, new: int | None = None) -> int:
        """The generation count at the start of ``.lock``; ``new`` is written first."""
        with self._fd_io:  # (the descriptor's offset is shared by this instance's threads)
            os.lseek(self._lock_fd, 0, os.SEEK_SET)
            if new is not None:
                os.write(self._lock_fd, new.to_bytes(8, "little"))
                return new
            return int.from_bytes(os.read(self._lock_fd, 8), "little")

    def changed(self) -> bool:
        """Whether the folder may differ from this instance's view: changed by another
        instance (or tool) since this one last scanned it or changed it itself."""
        return self.version() != self._seen

    def _stamp(self) -> int:
        """A wall-clock ns timestamp, strictly increasing in this process (LRU order)."""
        self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
        return self._last_stamp

    # --- writing ---------------------------------------------------------------------------

    def write_temp(self, chunks: list[bytes]) -> Path:
        """Write ``chunks`` to a new temp file (no lock needed); returns its path."""
        fd, tmp = tempfile.mkstemp(dir=self.temp_folder, prefix="w-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return Path(tmp)

    def commit(self, tmp: Path, name: str, last_used_ns: int | None = None) -> None:
        """Move a written temp file into place, as the most recently used or as last used at
        ``last_used_ns`` (under :meth:`lock`)."""
        stamp = self._stamp() if last_used_ns is None else last_used_ns
        os.utime(tmp, ns=(stamp, stamp))
        self._mutating()
        os.replace(tmp, self.path(name))

    def remove(self, stored: StoredFile, why: str = "") -> None:
        """Remove an entry file if it is still the one described (call under :meth:`lock`)."""
        path = self.path(stored.name)
        try:
            if os.stat(path).st_ino == stored.inode:
                self._mutating()
                os.unlink(path)
        except FileNotFoundError:
            return
        if why:
            log.debug("disk prompt cache: removed %s (%s)", stored.name, why)

    def touch(self, stored: StoredFile) -> None:
        """Mark an entry most recently used (its mtime; a pinned file's later deadline stays);
        a vanished file is ignored."""
        self.keep_until(stored, self._stamp())

    def keep_until(self, stored: StoredFile, stamp: int) -> None:
        """Set an entry's last use to ``stamp`` unless the file's is later already (a pinned
        file's deadline); a vanished file is ignored."""
        stamp = max(stamp, self.last_use(stored) or 0)
        with contextlib.suppress(OSError):
            os.utime(self.path(stored.name), ns=(stamp, stamp))
            stored.mtime_ns = stamp

    # --- reading ---------------------------------------------------------------------------

    def read_state(self, stored: StoredFile) -> bytes:
        """The verified state of an entry. ``FileNotFoundError`` if it vanished,
        ``DiskCacheFormatError`` if it is corrupt or no longer the indexed entry."""
        with open(self.path(stored.name), "rb") as f:
            header = read_header(f, os.fstat(f.fileno()).st_size)
            if (header.identity, header.token_ids) != (stored.header.identity,
                                                       stored.header.token_ids):
                raise DiskCacheFormatError("the file no longer holds the indexed entry")
            return read_state(f, header)

    def scan(self, known: dict[str, StoredFile]) -> dict[str, StoredFile]:
        """The entry files now in the folder (call under :meth:`lock`): ``known`` ones are
        reused when their inode and size are unchanged (their mtime refreshed), new ones have
        their header read; bad ones are removed with a warning."""
        found: dict[str, StoredFile] = {}
        self._scanned = True
        for name, st in self._entry_stats():
            old = known.get(name)
            if old is not None and (old.inode, old.size) == (st.st_ino, st.st_size):
                old.mtime_ns = st.st_mtime_ns
                found[name] = old
                continue
            stored = self._read_stored(name, st)
            if stored is not None:
                found[name] = stored
        self.sweep_temps(force=True)
        return found

    def stored(self, name: str) -> StoredFile | None:
        """The entry file ``name`` as it is now (its header read), or None if absent or bad
        (removed with a warning; call under :meth:`lock`)."""
        try:
            st = os.stat(self.path(name))
        except FileNotFoundError:
            return None
        return self._read_stored(name, st)

    def evict(self, files: list[StoredFile], budget: int) -> list[StoredFile]:
        """Remove the least recently used of ``files`` until the rest fit ``budget``; returns
        those gone (call under :meth:`lock`). Only the candidates' last uses are read again:
        another instance's :meth:`touch` moves a file's mtime, not the folder's, so an
        indexed mtime may be older than the file's."""
        total = sum(f.size for f in files)
        heap = [(f.mtime_ns, i) for i, f in enumerate(files)] if total > budget else []
        heapq.heapify(heap)
        gone = []
        while total > budget and heap:
            mtime, i = heapq.heappop(heap)
            stored = files[i]
            now = self.last_use(stored)
            if now is not None and now != mtime:  # used since it was indexed
                stored.mtime_ns = now
                heapq.heappush(heap, (now, i))
                continue
            if now is not None:
                self.remove(stored, "evicted")
            gone.append(stored)
            total -= stored.size
        return gone

    def last_use(self, stored: StoredFile) -> int | None:
        """The file's mtime now; None if it vanished or is another file."""
        try:
            st = os.stat(self.path(stored.name))
        except FileNotFoundError:
            return None
        return st.st_mtime_ns if st.st_ino == stored.inode else None

    def _entry_stats(self) -> list[tuple[str, os.stat_result]]:
        """The entry files in the folder with their stats (one pass of ``scandir``)."""
        out = []
        try:
            with os.scandir(self.folder) as entries:
                for entry in entries:
                    if entry.name.endswith(SUFFIX):
                        with contextlib.suppress(FileNotFoundError):
                            out.append((entry.name, entry.stat()))
        except FileNotFoundError:
            self.temp_folder.mkdir(parents=True, exist_ok=True)
        return out

    def _read_stored(self, name: str, st: os.stat_result) -> StoredFile | None:
        try:
            with open(self.path(name), "rb") as f:
                header = read_header(f, os.fstat(f.fileno()).st_size)
                held = tuple(p for p in read_positions(f) if 0 < p <= len(header.token_ids))
        except FileNotFoundError:
            return None
        except (DiskCacheFormatError, OSError) as exc:
            self.discard_bad(name, st.st_ino, exc)
            return None
        return StoredFile(name, header, st.st_size, st.st_ino, st.st_mtime_ns, held)

    def discard_bad(self, name: str, inode: int, exc: Exception) -> None:
        """Remove a corrupt or foreign entry file with a warning (call under :meth:`lock`)."""
        log.warning("disk prompt cache: removing %s: %s", self.path(name), exc)
        self.num_bad_files += 1
        path = self.path(name)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == inode:
                self._mutating()
                os.unlink(path)

    def sweep_temps(self, force: bool = False) -> None:
        """Remove temp files left by crashed writers (with ``force`` or every
        :data:`_SWEEP_S` at most; a scan sweeps, and a writer that need not scan asks)."""
        if not force and time.monotonic() - self._swept_at < _SWEEP_S:
            return
        self._swept_at = time.monotonic()
        cutoff = time.time() - _STALE_TEMP_S
        with contextlib.suppress(OSError):
            for tmp in self.temp_folder.iterdir():
                with contextlib.suppress(OSError):
                    if tmp.stat().st_mtime < cutoff:
                        tmp.unlink()
