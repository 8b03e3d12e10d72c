"""Disk cache reads for runs waiting to be resolved, off the tick thread.

A run whose best reuse source is a disk entry starts a read
(:meth:`~llamapy.engine.cache.disk.DiskPromptCache.read_async`: the file is read and its
checksum verified on the disk cache's reader thread) and stays unresolved, skipping ticks, until
the read completes; the other slots keep decoding meanwhile. Only ``state_seq_set`` (copying the
bytes into the KV) runs on the tick thread. When there is nothing else to decode the tick
blocks briefly on a pending read rather than spin. A read still running after ``wait_s`` is
abandoned (the run then chooses again without it); a run that ends while waiting is forgotten.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

from llamapy.engine.cache.disk_store import StoredFile
from llamapy.engine.cache.ram import CacheEntry
from llamapy.engine.cache.tier import ReadStatus

__all__ = ["DiskReads"]

log = logging.getLogger("llamapy.engine.cache.disk")


@dataclass(slots=True, eq=False)
class _Read:
    entry: StoredFile | CacheEntry
    future: Future[bytes | None]
    deadline: float


class DiskReads:
    """Pending reads by run serial (see the module docstring)."""

    def __init__(self, read_async: Callable[[StoredFile | CacheEntry], Future[bytes | None]],
                 wait_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.read_async = read_async
        self.wait_s = wait_s
        self.clock = clock
        self._reads: dict[int, _Read] = {}

    @property
    def pending(self) -> bool:
        """Whether any run waits for a read."""
        return bool(self._reads)

    def poll(self, serial: int, entry: StoredFile | CacheEntry
             ) -> tuple[ReadStatus, bytes | None]:
        """Start reading ``entry`` for run ``serial`` (a different entry than before replaces
        its read), or collect the read: ``(READY, state)``, ``(PENDING, None)`` or
        ``(FAILED, None)`` (vanished, corrupt, or too slow)."""
        read = self._reads.get(serial)
        if read is None or read.entry is not entry:
            read = _Read(entry, self.read_async(entry), self.clock() + self.wait_s)
            self._reads[serial] = read
        if not read.future.done():
            if self.clock() < read.deadline:
                return ReadStatus.PENDING, None
            log.warning("disk prompt cache: a read took over %.1f s; prefilling instead",
                        self.wait_s)
            del self._reads[serial]
            return ReadStatus.FAILED, None
        del self._reads[serial]
        try:
            data = read.future.result()
        except Exception:  # a bug in the reader: never a stuck or failed request
            log.exception("disk prompt cache: read failed")
            data = None
        return (ReadStatus.READY, data) if data is not None else (ReadStatus.FAILED, None)

    def forget(self, serial: int) -> None:
        """Drop run ``serial``'s read (the run ended or no longer needs it)."""
        self._reads.pop(serial, None)

    def wait(self, timeout: float = 0.05) -> None:
        """Block up to ``timeout`` seconds until a pending read completes."""
        if self._reads:
            wait([r.future for r in self._reads.values()], timeout, FIRST_COMPLETED)
