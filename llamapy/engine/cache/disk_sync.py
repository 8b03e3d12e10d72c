"""Keeping the disk prompt cache's index in step with its folder.

:class:`FolderIndex` is the part of :class:`~llamapy.engine.cache.disk.DiskPromptCache` that
rescans the folder when another instance changed it (on the writer thread when there is one,
one rescan queued at most), takes a just committed file into the index, drops the entries it
covers (not pinned ones before their deadline) and evicts least-recently-used files to each
tenant's share and to the budget, all under the folder's lock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from llamapy.engine.cache.disk_index import DiskIndex
from llamapy.engine.cache.disk_store import DiskStore, StoredFile

__all__ = ["FolderIndex"]

log = logging.getLogger("llamapy.engine.cache.disk")


class FolderIndex:
    """The folder-facing half of the disk cache (its state is set by the cache's
    ``__init__``)."""

    store: DiskStore | None
    budget_bytes: int
    tenant_budget: int
    num_evictions: int
    resume_points: bool
    _index: DiskIndex
    _mutex: threading.Condition
    _rescan_queued: bool
    _writer: ThreadPoolExecutor | None

    def refresh(self, *, force: bool = False) -> None:
        """Rescan the folder if it changed since the last scan (or ``force``)."""
        if self.store is None:
            return
        try:
            if not force and not self.store.changed():
                return
            with self.store.lock() as fresh:
                if force or not fresh:  # (not the case when the change was its own write)
                    self._sync_locked()
        except OSError as exc:
            log.warning("disk prompt cache: cannot scan %s: %s", self.store.folder, exc)

    def _refresh_soon(self) -> None:
        """Before a lookup (on the tick thread): :meth:`refresh` without background threads;
        else a changed folder is rescanned on the writer thread, one rescan queued at most, as
        a rescan stats every file and waits for the writers' lock."""
        writer = self._writer
        if writer is None or self.store is None:
            self.refresh()
            return
        with contextlib.suppress(OSError):  # (a failing rescan warns)
            if not self.store.changed():
                return
        with self._mutex:
            if self._rescan_queued:
                return
            self._rescan_queued = True
        try:
            writer.submit(self._queued_refresh)
        except RuntimeError:  # closed meanwhile
            self._rescan_queued = False

    def _queued_refresh(self) -> None:
        with self._mutex:
            self._rescan_queued = False
        self.refresh()

    def _sync_locked(self, keep: str | None = None, fresh: bool = False) -> None:
        """Bring the index up to date (under the lock): rescan the folder, or with ``fresh``
        (the folder as last seen) only take the just committed ``keep``; then drop the entries
        ``keep`` covers and evict LRU files to each tenant's share and to the budget."""
        assert self.store is not None
        if not fresh:
            with self._mutex:
                known = dict(self._index.files)
            files = self.store.scan(known)
            with self._mutex:
                self._index.set_files(files)
        elif keep is not None and (new := self.store.stored(keep)) is not None:
            with self._mutex:
                self._index.add_file(new)
            self.store.sweep_temps()
        with self._mutex:
            covered = (self._index.covered_by(keep, resume_points=self.resume_points)
                       if keep is not None else [])
        now = time.time_ns()
        for stored in (f for f in covered if f.mtime_ns <= now):  # (later: pinned)
            self.store.remove(stored, "covered")
            self._forget(stored)
        with self._mutex:
            groups = self._index.tenants_over(self.tenant_budget)
        for own in groups:
            self._evict(own, self.tenant_budget)
        with self._mutex:
            candidates = self._index.over(self.budget_bytes)
        self._evict(candidates, self.budget_bytes)

    def _evict(self, candidates: list[StoredFile], budget: int) -> None:
        assert self.store is not None
        for stored in self.store.evict(candidates, budget):
            self.num_evictions += 1
            self._forget(stored)

    def _forget(self, entry: StoredFile) -> None:
        with self._mutex:
            self._index.forget(entry)
