"""Level-3 prompt cache: serialised sequence state in files, byte-bounded on disk, LRU, kept
across restarts and shareable by servers on one folder.

Contract (the shape of :class:`~llamapy.engine.cache.ram.PromptCache`):

- An entry is ``(identity, cache_scope, token ids, state bytes)``. Its *identity* is a sha256
  of the host's :class:`CacheNamespace` (what the engine cannot know: the model file, tokenizer,
  chat template, BOS policy, libllama build and the context's KV settings), the key's
  ``cache_scope`` and ``cache_identity`` and the namespace's description of its adapter set.
  Only a request whose key gives the same identity and scope ever reads it; file names are
  ``<identity>-<token hash>`` and the index is searched by identity and scope.
- ``offer`` takes a prefix about to leave the levels above (evicted from RAM, or discarded from
  a slot when the RAM cache is off). It skips short prefixes, prefixes an entry covers and
  entries over the budget, sizing before serialising like the RAM cache. The state is
  serialised by the caller (on the tick thread: only it may touch the backend); the file is
  written by a background writer while the entry is already visible to :meth:`lookup` and
  :meth:`read` from memory. After each write, under the folder lock, the index takes the new
  file (the folder is rescanned first only if another instance changed it since this one last
  saw it), entries the new one covers are dropped, each tenant holding more than its share of
  the budget (``tenant_share``; the tenant is in each file's header) has its own
  least-recently-used files (by mtime) evicted down to its share, and then the folder's,
  whoever's, until it fits the budget (the RAM cache's policy).
- ``lookup`` finds the entry sharing the longest prefix with a prompt (at least
  ``min_fraction`` of it usable). When another server changed the folder (see
  :mod:`llamapy.engine.cache.disk_store`), it is rescanned: on the writer thread in the background
  (the lookup answers from the index as it stands), on the calling thread otherwise
  (:mod:`llamapy.engine.cache.disk_sync`). Lookups
  and cover checks go through a prefix index per identity and scope
  (:mod:`llamapy.engine.cache.disk_index`). ``read`` (or ``read_async``, off the caller's thread)
  returns the verified state, or None when the file vanished or is corrupt (then removed).
- ``pin`` files a pinned RAM entry as last used at its deadline (:meth:`pin`): it is evicted
  after every unpinned file, and a file covering it does not drop it until then.
- Named blobs (:meth:`save_blob` / :meth:`load_blob`: session snapshots, which carry and
  verify their own manifest) live in the same files, budget, LRU and lock; no prompt ever
  matches one.
- Start: the index is rebuilt from the headers in the folder, bad files removed, the budget
  enforced. See :mod:`llamapy.engine.cache.disk_store` (atomicity, locking) and
  :mod:`llamapy.engine.cache.disk_format` (the file format). Never raises to the engine for disk
  trouble: an unwritable folder costs a warning and the write.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from llamapy.engine.cache.checkpoints import positions
from llamapy.engine.cache.disk_format import (
    CacheNamespace,
    blob_identity,
    encode_entry,
    entry_identity,
    file_size,
    media_runs,
)
from llamapy.engine.cache.disk_index import DiskIndex, Found
from llamapy.engine.cache.disk_reads import DiskReads
from llamapy.engine.cache.disk_store import DiskStore, StoredFile, entry_name
from llamapy.engine.cache.disk_sync import FolderIndex
from llamapy.engine.cache.radix import restorable
from llamapy.engine.cache.ram import CacheEntry, tenant_budget
from llamapy.engine.cache.tier import ReadStatus
from llamapy.engine.options import EngineConfig, EngineTuning
from llamapy.engine.request import CacheKey
from llamapy.errors import DiskCacheFormatError, InvalidOptionError

__all__ = ["CacheNamespace", "DiskPromptCache", "open_disk_cache"]

log = logging.getLogger("llamapy.engine.cache.disk")


class DiskPromptCache(FolderIndex):
    """A byte-bounded LRU of entry files in ``folder`` (see the module docstring). Thread-safe.

    ``folder=None`` or a budget of 0 is a disabled cache. ``background=False`` writes and reads
    on the calling thread (deterministic tests). ``max_pending_bytes`` bounds the states
    waiting to be written; an offer beyond it is dropped (or waits, with ``wait=True``).
    ``tenant_share`` is the share of the budget one tenant's files may hold. The disk
    :class:`~llamapy.engine.cache.tier.CacheTier`: :meth:`fetch` reads on the reader thread,
    and a read still running after ``read_wait_s`` fails.
    """

    name = "disk"

    def __init__(self, folder: str | os.PathLike[str] | None, budget_bytes: int, *,
                 namespace: CacheNamespace, min_tokens: int = 32, min_fraction: float = 0.5,
                 background: bool = True, max_pending_bytes: int = 1 << 30,
                 tenant_share: float = 1.0, read_wait_s: float = 30.0) -> None:
        self.budget_bytes = budget_bytes if folder is not None else 0
        self.tenant_budget = tenant_budget(self.budget_bytes, tenant_share)
        self.namespace = namespace
        self.min_tokens, self.min_fraction = min_tokens, min_fraction
        self.resume_points = False  #: covering needs a resume point (disk_index.resumes_at)
        self.max_pending_bytes = max_pending_bytes
        self.num_writes = self.num_write_failures = self.num_dropped = self.num_evictions = 0
        self._index = DiskIndex()
        self._pending_bytes = 0
        self._identities: dict[CacheKey, bytes] = {}
        self._mutex = threading.Condition()
        self._deadline: float | None = None
        self._rescan_queued = False
        self.store = DiskStore(folder) if self.enabled and folder is not None else None
        self._writer = _executor("llamapy-disk-write") if background and self.store else None
        self._reader = _executor("llamapy-disk-read") if background and self.store else None
        self.reads = DiskReads(self.read_async, read_wait_s)
        self.refresh(force=True)

    @property
    def enabled(self) -> bool:
        """False without a folder or with a budget of 0."""
        return self.budget_bytes > 0

    @property
    def total_bytes(self) -> int:
        """Bytes of the indexed files."""
        with self._mutex:
            return self._index.total_bytes

    def __len__(self) -> int:
        with self._mutex:
            return len(self._index.files)

    def tenant_bytes(self) -> dict[str | None, int]:
        """Bytes of the indexed files by tenant (tenants holding none are absent)."""
        with self._mutex:
            return dict(self._index.tenant_bytes)

    def files(self) -> list[StoredFile]:
        """Indexed files, least recently used first."""
        with self._mutex:
            return sorted(self._index.files.values(), key=lambda f: f.mtime_ns)

    def identity(self, key: CacheKey) -> bytes:
        """The identity of entries filed under ``key`` (see the module docstring)."""
        found = self._identities.get(key)
        if found is None:
            if len(self._identities) > 4096:
                self._identities.clear()
            found = self._identities[key] = entry_identity(self.namespace, key)
        return found

    # --- storing ---------------------------------------------------------------------------

    def offer(self, key: CacheKey | None, token_ids: Sequence[int], get_size: Callable[[], int],
              get_data: Callable[[], bytes], *, wait: bool = False,
              last_used_ns: int | None = None) -> bool:
        """Store a prefix (``get_size``/``get_data`` as for ``PromptCache.offer``: sized only
        when long enough and uncovered, serialised only when it fits the budget). Returns
        whether it was accepted; the file is written in the background, as the most recently
        used entry (or as last used at ``last_used_ns``, wall-clock ns)."""
        tokens = tuple(token_ids)
        if not self.enabled or key is None or len(tokens) < self.min_tokens:
            return False
        ident = self.identity(key)
        with self._mutex:
            if self._index.covers(ident, key.cache_scope, tokens,
                                  resume_points=self.resume_points):
                return False
        return self._submit(key, tokens, ident, get_size, get_data, wait, last_used_ns)

    def covers(self, key: CacheKey | None, token_ids: Sequence[int]) -> bool:
        """Whether a file (or one being written) under ``key`` holds ``token_ids`` or more."""
        if not self.enabled or key is None:
            return False
        ident = self.identity(key)
        with self._mutex:
            return self._index.covers(ident, key.cache_scope, tuple(token_ids),
                                      resume_points=self.resume_points)

    def pin(self, entry: CacheEntry, until_ns: int) -> bool:
        """Keep a pinned RAM cache entry on disk until ``until_ns`` (wall-clock ns): its file is
        filed as last used then, so least-recently-used eviction takes it after every file
        not pinned (pinned ones by earliest deadline), and a longer file covering it does not
        drop it before then. A file of the entry already there has its deadline moved."""
        key = entry.key
        if not self.enabled or not isinstance(key, CacheKey) or self.store is None:
            return False
        ident = self.identity(key)
        name = entry_name(ident, entry.token_ids)
        with self._mutex:
            stored = self._index.files.get(name)
        if stored is not None:
            self.store.keep_until(stored, until_ns)
            return True
        return self._submit(key, entry.token_ids, ident, lambda: len(entry.data),
                            lambda: entry.data, False, until_ns)

    def _submit(self, key: CacheKey, tokens: tuple[int, ...], ident: bytes,
                get_size: Callable[[], int], get_data: Callable[[], bytes], wait: bool,
                last_used_ns: int | None) -> bool:
        """Size, serialise, reserve and queue the write of an entry (see :meth:`offer`)."""
        runs = media_runs(tokens)
        if file_size(key.cache_scope, len(tokens), get_size(), key.tenant, runs) \
                > self.tenant_budget:
            return False
        data = get_data()
        size = file_size(key.cache_scope, len(tokens), len(data), key.tenant, runs)
        if size > self.tenant_budget or not self._reserve(size, wait):
            return False
        entry = CacheEntry(key, tokens, data)
        name = entry_name(ident, tokens)
        with self._mutex:
            self._index.add_pending(name, ident, entry)
        if self._writer is None:
            self._write(name, entry, size, last_used_ns)
        else:
            self._writer.submit(self._write, name, entry, size, last_used_ns)
        return True

    def offer_entry(self, entry: CacheEntry, *, wait: bool = False,
                    last_used_ns: int | None = None) -> bool:
        """Offer a RAM cache entry (one it evicts)."""
        key = entry.key if isinstance(entry.key, CacheKey) else None
        return self.offer(key, entry.token_ids, lambda: len(entry.data), lambda: entry.data,
                          wait=wait, last_used_ns=last_used_ns)

    def _reserve(self, size: int, wait: bool) -> bool:
        with self._mutex:
            while self._pending_bytes and self._pending_bytes + size > self.max_pending_bytes:
                if not wait:
                    self.num_dropped += 1
                    return False
                self._mutex.wait()
            self._pending_bytes += size
            return True

    def _write(self, name: str, entry: CacheEntry, size: int,
               last_used_ns: int | None = None) -> None:
        """The writer's job: temp file, commit, index, drop covered, evict (under the lock)."""
        assert self.store is not None and isinstance(entry.key, CacheKey)
        try:
            if self._deadline is not None and time.monotonic() > self._deadline:
                with self._mutex:
                    self.num_dropped += 1
                return
            ident = self.identity(entry.key)
            tmp = self.store.write_temp(encode_entry(ident, entry.key.cache_scope,
                                                     entry.token_ids, entry.data,
                                                     entry.key.tenant))
            with self.store.committing(tmp, name, last_used_ns) as fresh:
                self._sync_locked(keep=name, fresh=fresh)
            self.num_writes += 1
        except OSError as exc:
            log.warning("disk prompt cache: cannot write %s: %s", name, exc)
            self.num_write_failures += 1
        finally:
            with self._mutex:
                self._index.pop_pending(name)
                self._pending_bytes -= size
                self._mutex.notify_all()

    # --- finding and reading ---------------------------------------------------------------

    def lookup(self, key: CacheKey | None, prompt: Sequence[int], cap: int, *,
               exact: bool = False) -> tuple[Found | None, int]:
        """The entry with the longest usable prefix of ``prompt`` (at most ``cap`` tokens) and
        that length; ``(None, 0)`` if none is worth restoring. ``exact``: only entries usable
        whole. An entry is a :class:`StoredFile`, or a :class:`CacheEntry` still being
        written."""
        if not self.enabled or key is None:
            return None, 0
        self._refresh_soon()
        ident, usable = self.identity(key), restorable(self.min_fraction, exact)
        with self._mutex:
            return self._index.best(ident, key.cache_scope, tuple(prompt[:cap]), usable)

    def read(self, entry: Found) -> bytes | None:
        """The verified state of ``entry``; None if its file vanished or is corrupt (removed
        with a warning)."""
        if isinstance(entry, CacheEntry):
            return entry.data
        assert self.store is not None
        try:
            return self.store.read_state(entry)
        except FileNotFoundError:
            if self.store.last_use(entry) is None:  # (not rewritten meanwhile as that inode)
                self._forget(entry)
        except (DiskCacheFormatError, OSError) as exc:
            with self.store.lock():
                self.store.discard_bad(entry.name, entry.inode, exc)
                self._forget(entry)
        return None

    def read_async(self, entry: Found) -> Future[bytes | None]:
        """:meth:`read` on the reader thread (at once, with ``background=False``)."""
        if self._reader is not None and isinstance(entry, StoredFile):
            return self._reader.submit(self.read, entry)
        future: Future[bytes | None] = Future()
        future.set_result(self.read(entry))
        return future

    def fetch(self, serial: int, entry: Found) -> tuple[ReadStatus, bytes | None]:
        """Start reading ``entry`` on the reader thread for run ``serial``, or collect that
        read (:class:`~llamapy.engine.cache.disk_reads.DiskReads`)."""
        return self.reads.poll(serial, entry)

    def forget(self, serial: int) -> None:
        """Drop run ``serial``'s read."""
        self.reads.forget(serial)

    def wait(self, timeout: float = 0.05) -> None:
        """Block up to ``timeout`` seconds until a pending read completes."""
        self.reads.wait(timeout)

    def checkpoint_positions(self, entry: Found) -> Sequence[int] | None:
        """The checkpoint positions of an entry (a file's, read with its header)."""
        return positions(entry.data) if isinstance(entry, CacheEntry) else entry.checkpoints

    def touch(self, entry: Found) -> None:
        """Mark ``entry`` most recently used."""
        if isinstance(entry, StoredFile) and self.store is not None:
            self.store.touch(entry)

    def token_ids(self, entry: Found) -> tuple[int, ...]:
        """The tokens ``entry`` holds."""
        return entry.token_ids if isinstance(entry, CacheEntry) else entry.header.token_ids

    # --- named blobs -----------------------------------------------------------------------

    def save_blob(self, name: str, data: bytes) -> bool:
        """Store ``data`` under ``name`` on the calling thread (replacing an earlier blob of
        that name); False when disabled or over the budget. ``OSError`` if the write fails."""
        if self.store is None:
            return False
        ident = blob_identity(name)
        if file_size(None, 0, len(data)) > self.tenant_budget:  # (the default tenant's)
            return False
        fname = entry_name(ident, ())
        tmp = self.store.write_temp(encode_entry(ident, None, (), data))
        with self.store.committing(tmp, fname) as fresh:
            self._sync_locked(keep=fname, fresh=fresh)
        return True

    def load_blob(self, name: str) -> bytes | None:
        """The blob saved under ``name`` (marked recently used); None if absent, evicted or
        corrupt (then removed)."""
        if self.store is None:
            return None
        self.refresh()
        with self._mutex:
            stored = self._index.files.get(entry_name(blob_identity(name), ()))
        data = None if stored is None else self.read(stored)
        if stored is not None and data is not None:
            self.touch(stored)
        return data

    # --- lifecycle -------------------------------------------------------------------------

    def close(self, flush_s: float | None = None) -> None:
        """Finish pending writes (those not started within ``flush_s`` seconds are dropped)
        and stop the background threads; idempotent."""
        if flush_s is not None:
            self._deadline = time.monotonic() + flush_s
        for executor in (self._writer, self._reader):
            if executor is not None:
                executor.shutdown(wait=True)
        self._writer = self._reader = None
        if self.store is not None:
            self.store.close()

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if the index is over budget (or a tenant over its share) or
        the pending accounting is broken (outside a writer's critical section)."""
        with self._mutex:
            total = sum(f.size for f in self._index.files.values())
            pending = self._pending_bytes
            self._index.check(self.tenant_budget)
            if total != self._index.total_bytes:
                raise AssertionError("disk cache: the running byte total is wrong")
        if total > max(self.budget_bytes, 0):
            raise AssertionError(f"disk cache: {total} bytes over budget {self.budget_bytes}")
        if pending < 0:
            raise AssertionError(f"disk cache: pending bytes {pending} < 0")


def _executor(name: str) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)


def open_disk_cache(config: EngineConfig, tuning: EngineTuning,
                    namespace: CacheNamespace | None) -> DiskPromptCache:
    """The disk prompt cache of ``config`` (a disabled one without a folder).
    ``InvalidOptionError`` without a namespace or when the folder cannot be used."""
    folder = config.prompt_cache_dir
    if folder is not None and namespace is None:
        raise InvalidOptionError("prompt_cache_dir needs a cache namespace naming the model "
                                 "(the host passes one)", option="prompt_cache_dir")
    try:
        return DiskPromptCache(folder, config.prompt_cache_disk_bytes,
                               namespace=namespace or CacheNamespace(""),
                               min_tokens=tuning.disk_min_tokens,
                               min_fraction=tuning.disk_min_fraction,
                               background=tuning.disk_background,
                               tenant_share=config.tenant_cache_share,
                               read_wait_s=tuning.disk_read_wait_s)
    except OSError as exc:
        raise InvalidOptionError(f"prompt_cache_dir: cannot use {folder}: {exc}",
                                 option="prompt_cache_dir") from exc
