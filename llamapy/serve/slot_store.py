"""The folder of ``--slot-save-path``: where each tenant's slot files live, the budgets they are
saved within, and how one is written and read.

**Layout.** The default tenant's files are in the folder itself, tenant ``NAME``'s in
``tenant=NAME/`` (``=`` is in no filename, so no filename reaches a tenant's folder or blocks its
creation). A filename is one path component of letters, digits, ``.``, ``_`` and ``-``, not
starting with a dot; temp files start with one, so they are never a slot file.

**Budgets** (:class:`SlotBudget`, from the ``slot_save_*`` serving options; 0 = no bound): the
bytes and the files of the whole folder, and of each tenant. They count what is in the folder:
its files are counted when the store opens (at the app's start: a restart keeps the counts),
then every save through the store. A save that would pass a bound is refused before it writes
anything (:class:`~llamapy.errors.SlotFileBudgetError`, 403); a save over an existing file counts
its new size in place of the old one's, so a tenant at a bound can still replace its files with
ones no larger. Nothing over HTTP deletes a slot file: files the operator removes are counted
again at the next start. One server per folder (two sharing one each count their own saves).

**Writing** (POSIX: every file operation is relative to a folder's descriptor). A save writes a
temp file of a random name in the target folder, created ``O_CREAT | O_EXCL | O_NOFOLLOW`` with
mode 0600 (nothing planted under that name is followed or reused), then renames it over the
filename (``os.replace``: atomic; a symlink planted at the filename is replaced, never written
through). A tenant's folder is made and opened ``O_NOFOLLOW | O_DIRECTORY`` relative to the
folder: a symlink planted in its place is refused (a 400), never followed. The folder itself is
the operator's choice and may be a symlink.

**Reading.** A restore opens the file ``O_NOFOLLOW | O_NONBLOCK``: a symlink, a FIFO or anything
but a regular file is refused, and so is a file larger than a save could have written (the
tenant's byte bound, else the folder's).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import (
    InvalidRequestError,
    QueueFullError,
    SlotFileBudgetError,
    UnsupportedFeatureError,
)
from ..options.serve import ServeOptions
from .tenants import TENANT_NAME

__all__ = ["FILENAME", "SlotBudget", "SlotStore"]

log = logging.getLogger("llamapy.serve")

#: A slot file's name.
FILENAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
#: The folder of tenant ``NAME``'s files: this prefix and the name.
TENANT_PREFIX = "tenant="
#: Saves and restores under way at once (each holds a slot's KV in memory, in copies).
MAX_MOVING = 2
_MB = 1024 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


@dataclass(frozen=True, slots=True)
class SlotBudget:
    """The slot-file bounds in bytes and files (0: none): of the folder and of one tenant."""

    max_bytes: int = 0
    max_files: int = 0
    tenant_max_bytes: int = 0
    tenant_max_files: int = 0

    @classmethod
    def of(cls, options: ServeOptions) -> SlotBudget:
        """The budget of the ``slot_save_*`` serving options (checked there)."""
        return cls(int(options.slot_save_max_mb * _MB), options.slot_save_max_files,
                   int(options.slot_save_tenant_max_mb * _MB),
                   options.slot_save_tenant_max_files)

    @property
    def largest_file(self) -> int:
        """The most bytes one file may hold (0: no bound)."""
        bounds = [n for n in (self.tenant_max_bytes, self.max_bytes) if n > 0]
        return min(bounds) if bounds else 0


class SlotStore:
    """The slot files of one folder (see the module): their counts, saves and reads."""

    def __init__(self, folder: str | os.PathLike[str], budget: SlotBudget | None = None
                 ) -> None:
        # (os.replace takes folder descriptors where os.rename does: one call)
        if not {os.open, os.mkdir, os.rename, os.unlink} <= os.supports_dir_fd:
            raise UnsupportedFeatureError("slot_save_path", "slot files need a platform that "
                                          "opens files relative to a folder (POSIX)")
        self.folder = Path(folder).expanduser()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.budget = budget or SlotBudget()
        self._lock = threading.Lock()
        self._moving = threading.BoundedSemaphore(MAX_MOVING)
        #: Each tenant's files and their sizes.
        self._sizes: dict[str | None, dict[str, int]] = _scan(self.folder)

    @contextlib.contextmanager
    def moving(self) -> Iterator[None]:
        """One save or restore under way (it holds a slot's KV in memory, in copies): at most
        :data:`MAX_MOVING` at once; one more is a 429 at once, nothing read or written."""
        if not self._moving.acquire(blocking=False):
            raise QueueFullError(MAX_MOVING)
        try:
            yield
        finally:
            self._moving.release()

    # --- budgets ------------------------------------------------------------------------------

    def usage(self, tenant: str | None) -> tuple[int, int]:
        """``(bytes, files)`` of ``tenant``'s slot files."""
        with self._lock:
            sizes = self._sizes.get(tenant, {})
            return sum(sizes.values()), len(sizes)

    def total(self) -> tuple[int, int]:
        """``(bytes, files)`` of every tenant's slot files."""
        with self._lock:
            return (sum(sum(f.values()) for f in self._sizes.values()),
                    sum(len(f) for f in self._sizes.values()))

    def check_room(self, tenant: str | None, filename: str, size: int = 0) -> None:
        """Raise :class:`SlotFileBudgetError` unless ``tenant`` may save ``size`` bytes as
        ``filename`` (size 0: whether it may save that file at all, bytes aside)."""
        with self._lock:
            self._check_room(tenant, filename, size)

    def _check_room(self, tenant: str | None, filename: str, size: int) -> None:
        own = self._sizes.get(tenant, {})
        old = own.get(filename)
        added_files = 0 if old is not None else 1
        added_bytes = size - (old or 0)
        all_bytes = sum(sum(f.values()) for f in self._sizes.values())
        all_files = sum(len(f) for f in self._sizes.values())
        budget = self.budget
        for option, limit, used, added, what in (
                ("slot_save_tenant_max_files", budget.tenant_max_files, len(own), added_files,
                 "this tenant's files"),
                ("slot_save_tenant_max_mb", budget.tenant_max_bytes, sum(own.values()),
                 added_bytes, "this tenant's bytes"),
                ("slot_save_max_files", budget.max_files, all_files, added_files,
                 "the server's files"),
                ("slot_save_max_mb", budget.max_bytes, all_bytes, added_bytes,
                 "the server's bytes")):
            if limit > 0 and added > 0 and used + added > limit:
                raise SlotFileBudgetError(option, limit, what)

    # --- files --------------------------------------------------------------------------------

    def save(self, tenant: str | None, filename: str, data: bytes) -> None:
        """Write ``data`` as ``tenant``'s ``filename`` (see the module), within the budget."""
        _check_filename(filename)
        with self._lock:
            self._check_room(tenant, filename, len(data))
            try:
                with self._open_folder(tenant, create=True) as folder:
                    _write_replace(folder, filename, data)
            except OSError as exc:  # (the folder gone, or not writable)
                raise _write_error(filename, exc) from exc
            self._sizes.setdefault(tenant, {})[filename] = len(data)

    def read(self, tenant: str | None, filename: str) -> bytes:
        """``tenant``'s ``filename`` (``InvalidRequestError`` naming why it cannot be read)."""
        _check_filename(filename)
        try:
            with self._open_folder(tenant, create=False) as folder:
                return _read_regular(folder, filename, self.budget.largest_file)
        except OSError as exc:
            raise InvalidRequestError(f"Unable to restore slot: cannot read {filename}: "
                                      f"{exc.strerror or exc}") from exc

    @contextlib.contextmanager
    def _open_folder(self, tenant: str | None, *, create: bool) -> Iterator[int]:
        """A descriptor of ``tenant``'s folder (made first with ``create``); a tenant's folder
        that is not a plain folder (a symlink, a file) is an ``InvalidRequestError``."""
        root = os.open(self.folder, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        try:
            if tenant is None:
                yield root
                return
            if not TENANT_NAME.fullmatch(tenant):
                raise InvalidRequestError("Unable to use slot files: not a tenant name")
            name = TENANT_PREFIX + tenant
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=root)
            try:
                fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC,
                             dir_fd=root)
            except FileNotFoundError:
                raise
            except OSError as exc:
                log.warning("slot files: %s/%s is not a plain folder; refused", self.folder,
                            name)
                raise InvalidRequestError("Unable to use slot files: the tenant's folder is "
                                          "not a plain folder") from exc
            try:
                yield fd
            finally:
                os.close(fd)
        finally:
            os.close(root)


def _check_filename(filename: object) -> None:
    if not isinstance(filename, str) or not FILENAME.fullmatch(filename):
        raise InvalidRequestError("Invalid filename: one path component of letters, digits, "
                                  "'.', '_' and '-'")


def _write_replace(folder: int, filename: str, data: bytes) -> None:
    """``data`` in a fresh temp file of a random name in ``folder``, renamed over
    ``filename``."""
    temp = f".slot-{secrets.token_hex(16)}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600,
                     dir_fd=folder)
    except OSError as exc:  # (anything there already, a planted symlink too: not ours)
        raise _write_error(filename, exc) from exc
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temp, filename, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=folder)
        if isinstance(exc, OSError):
            raise _write_error(filename, exc) from exc
        raise


def _write_error(filename: str, exc: OSError) -> InvalidRequestError:
    log.warning("slot files: cannot write %s: %r", filename, exc)
    return InvalidRequestError(f"Unable to save slot: cannot write {filename}: "
                               f"{exc.strerror or exc}")


def _read_regular(folder: int, filename: str, largest: int) -> bytes:
    """The bytes of regular file ``filename`` in ``folder`` (no symlink, no FIFO, none larger
    than ``largest`` when it is > 0)."""
    fd = os.open(filename, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=folder)
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InvalidRequestError(f"Unable to restore slot: {filename} is not a file")
        if 0 < largest < info.st_size:
            raise InvalidRequestError(f"Unable to restore slot: {filename} is larger than a "
                                      "slot file may be")
        return source.read()


def _scan(folder: Path) -> dict[str | None, dict[str, int]]:
    """The slot files in ``folder`` now, by tenant (symlinks and other entries not counted)."""
    found: dict[str | None, dict[str, int]] = {None: _files(folder)}
    with os.scandir(folder) as entries:
        for entry in entries:
            tenant = entry.name[len(TENANT_PREFIX):]
            if (entry.name.startswith(TENANT_PREFIX) and TENANT_NAME.fullmatch(tenant)
                    and entry.is_dir(follow_symlinks=False)):
                found[tenant] = _files(Path(entry.path))
    return {tenant: files for tenant, files in found.items() if files}


def _files(folder: Path) -> dict[str, int]:
    """The slot files of one folder and their sizes."""
    sizes: dict[str, int] = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            if FILENAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                sizes[entry.name] = entry.stat(follow_symlinks=False).st_size
    return sizes
