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
- **Nothing foreign is trusted**: :meth:`DiskStore.scan` reads headers only
  (:func:`~llamapy.engine.disk_format.read_header`); a file with our suffix whose header is
  corrupt, truncated, of another version or not ours at all is removed with a warning (only if
  it is still the file that was read: same inode). Files without the suffix are left alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamapy.engine.disk_format import EntryHeader, read_header, read_state, token_bytes
from llamapy.errors import DiskCacheFormatError

try:
    import fcntl
except ImportError:  # Windows: one process per folder (the thread lock still holds)
    fcntl = None  # type: ignore[assignment]

__all__ = ["SUFFIX", "DiskStore", "StoredFile", "entry_name"]

log = logging.getLogger("llamapy.engine.disk_cache")

SUFFIX = ".lpkv"
#: Temp files older than this are left over from a crash (a write takes seconds at most).
_STALE_TEMP_S = 3600.0
#: File timestamps are coarse (a kernel tick); changes closer than this to a scan may share
#: its folder mtime, so a folder changed this recently is rescanned regardless.
_MTIME_SLACK_NS = 50_000_000


def entry_name(identity: bytes, token_ids: Sequence[int]) -> str:
    """``<identity>-<token hash>.lpkv``: one file per identity and token sequence."""
    tokens = hashlib.sha256(token_bytes(token_ids)).hexdigest()[:32]
    return f"{identity.hex()[:32]}-{tokens}{SUFFIX}"


@dataclass(slots=True, eq=False)
class StoredFile:
    """One entry file: its name, verified header, size, inode and last use (``mtime_ns``)."""

    name: str
    header: EntryHeader
    size: int
    inode: int
    mtime_ns: int


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
        self._scan_mtime = -1
        self._scan_at = 0

    def close(self) -> None:
        """Close the lock file; idempotent."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive use of the folder, across threads and processes."""
        with self._thread_lock:
            if fcntl is None:
                yield
                return
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def path(self, name: str) -> Path:
        """The path of an entry file."""
        return self.folder / name

    def changed(self, *, settled: bool = False) -> bool:
        """Whether the folder may have changed since the last :meth:`scan` (its mtime moves
        whenever an entry is committed or removed; a scan this close to the mtime is not
        trusted). ``settled``: and changed long enough ago that a scan now would be."""
        mtime = os.stat(self.folder).st_mtime_ns
        if mtime == self._scan_mtime and self._scan_at - mtime >= _MTIME_SLACK_NS:
            return False
        return not settled or time.time_ns() - mtime >= _MTIME_SLACK_NS

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
        os.replace(tmp, self.path(name))

    def remove(self, stored: StoredFile, why: str = "") -> None:
        """Remove an entry file if it is still the one described (call under :meth:`lock`)."""
        path = self.path(stored.name)
        try:
            if os.stat(path).st_ino == stored.inode:
                os.unlink(path)
        except FileNotFoundError:
            return
        if why:
            log.debug("disk prompt cache: removed %s (%s)", stored.name, why)

    def touch(self, stored: StoredFile) -> None:
        """Mark an entry most recently used (its mtime); a vanished file is ignored."""
        stamp = self._stamp()
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
        self._scan_at = time.time_ns()
        self._scan_mtime = os.stat(self.folder).st_mtime_ns
        for name in self._entry_names():
            try:
                st = os.stat(self.path(name))
            except FileNotFoundError:
                continue
            old = known.get(name)
            if old is not None and (old.inode, old.size) == (st.st_ino, st.st_size):
                old.mtime_ns = st.st_mtime_ns
                found[name] = old
                continue
            stored = self._read_stored(name, st)
            if stored is not None:
                found[name] = stored
        self._remove_stale_temps()
        return found

    def _entry_names(self) -> list[str]:
        try:
            return [n for n in os.listdir(self.folder) if n.endswith(SUFFIX)]
        except FileNotFoundError:
            self.temp_folder.mkdir(parents=True, exist_ok=True)
            return []

    def _read_stored(self, name: str, st: os.stat_result) -> StoredFile | None:
        try:
            with open(self.path(name), "rb") as f:
                header = read_header(f, os.fstat(f.fileno()).st_size)
        except FileNotFoundError:
            return None
        except (DiskCacheFormatError, OSError) as exc:
            self.discard_bad(name, st.st_ino, exc)
            return None
        return StoredFile(name, header, st.st_size, st.st_ino, st.st_mtime_ns)

    def discard_bad(self, name: str, inode: int, exc: Exception) -> None:
        """Remove a corrupt or foreign entry file with a warning (call under :meth:`lock`)."""
        log.warning("disk prompt cache: removing %s: %s", self.path(name), exc)
        self.num_bad_files += 1
        path = self.path(name)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == inode:
                os.unlink(path)

    def _remove_stale_temps(self) -> None:
        cutoff = time.time() - _STALE_TEMP_S
        with contextlib.suppress(OSError):
            for tmp in self.temp_folder.iterdir():
                with contextlib.suppress(OSError):
                    if tmp.stat().st_mtime < cutoff:
                        tmp.unlink()
