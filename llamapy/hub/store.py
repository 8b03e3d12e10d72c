"""The local model store: models pulled by name, listed, shown and removed.

A store is a folder (``--models-dir``; default ``$LLAMAPY_MODELS_DIR``, else
``<llamapy cache>/store``) whose ``manifests/`` holds one JSON manifest per pulled model: its
name (``hf.co/ORG/REPO:TAG``, as Ollama names Hub models), local aliases, the repository,
revision and files (size, sha256) it came from, and where the files lie in huggingface_hub's
cache. ``python -m llamapy.serve --models-dir DIR`` serves every manifest of ``DIR`` by its name
and aliases, beside DIR's ``*.gguf`` files.

Nothing half-written is ever in the store: the files are downloaded and verified first
(:func:`llamapy.hub.fetch.fetch_model`), then the manifest is written to a temporary name and
renamed over its final one. Removing a model deletes its manifest, then each cached file no
other manifest refers to.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._paths import cache_dir
from ..errors import InvalidOptionError, StoreEntryNotFoundError
from ..options._spec import check
from ..options.hub import ModelRef, parse_model_ref
from .fetch import Downloaded, HubAccess, discard, fetch_model

__all__ = ["ModelStore", "StoreEntry", "check_alias", "default_store_dir"]

#: The environment variable naming the default store folder.
STORE_ENV = "LLAMAPY_MODELS_DIR"
#: The most aliases one model may have.
MAX_ALIASES = 16
_ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


def default_store_dir() -> Path:
    """``$LLAMAPY_MODELS_DIR``, else ``<llamapy cache>/store``."""
    env = os.environ.get(STORE_ENV)
    return Path(env).expanduser() if env else cache_dir() / "store"


def check_alias(alias: str) -> str:
    """A local alias: a letter or digit, then up to 63 of letters, digits, ``_.:-``."""
    check(isinstance(alias, str) and _ALIAS.match(alias) is not None, "alias",
          f"expected a name of letters, digits and _.:- (at most 64), got {alias!r}")
    return alias


@dataclass(frozen=True, slots=True)
class StoreEntry:
    """A pulled model, as its manifest records it."""

    name: str
    repo: str
    tag: str
    revision: str
    files: tuple[str, ...]
    sha256: tuple[str, ...]
    paths: tuple[str, ...]
    size: int
    modified: str
    aliases: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        """The file to load (a split GGUF's first part)."""
        return Path(self.paths[0])

    @property
    def digest(self) -> str:
        """The first file's sha256 (Ollama lists a digest per model)."""
        return self.sha256[0] if self.sha256 else ""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> StoreEntry:
        """A manifest's entry; :class:`InvalidOptionError` for a malformed one."""
        try:
            tuples = {k: tuple(str(v) for v in data[k])
                      for k in ("files", "sha256", "paths", "aliases")}
            return cls(name=str(data["name"]), repo=str(data["repo"]), tag=str(data["tag"]),
                       revision=str(data["revision"]), size=int(data["size"]),
                       modified=str(data["modified"]), **tuples)
        except (KeyError, TypeError, ValueError):
            raise InvalidOptionError("malformed store manifest", option="models_dir") from None


def _manifest_name(name: str) -> str:
    return name.replace("/", "--").replace(":", "@") + ".json"


class ModelStore:
    """The store in folder ``root`` (created on the first pull)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_store_dir()
        self.manifests = self.root / "manifests"

    def entries(self) -> list[StoreEntry]:
        """Every pulled model, by name; a malformed manifest raises."""
        if not self.manifests.is_dir():
            return []
        found = []
        for path in sorted(self.manifests.glob("*.json")):
            try:
                found.append(StoreEntry.from_json(json.loads(path.read_text("utf-8"))))
            except (ValueError, InvalidOptionError):
                raise InvalidOptionError(f"malformed store manifest {path}",
                                         option="models_dir") from None
        return sorted(found, key=lambda e: e.name)

    def find(self, name: str) -> StoreEntry:
        """The entry named (or aliased) ``name``; a Hub name without a tag means ``:latest``
        and tags match without regard to case. Raises :class:`StoreEntryNotFoundError`."""
        entries = self.entries()
        for entry in entries:
            if name in entry.aliases:
                return entry
        wanted = _hub_name(name)
        for entry in entries:
            if wanted is not None and entry.name == wanted:
                return entry
        raise StoreEntryNotFoundError(name, tuple(e.name for e in entries))

    def pull(self, ref: ModelRef, access: HubAccess, aliases: tuple[str, ...] = (),
             max_bytes: int = 0) -> StoreEntry:
        """Download (or find in the cache) and verify ``ref``, then record it atomically;
        ``max_bytes`` > 0 caps the download (:func:`~llamapy.hub.fetch.fetch_model`)."""
        check(len(aliases) <= MAX_ALIASES, "alias", f"at most {MAX_ALIASES} aliases")
        for alias in aliases:
            check_alias(alias)
        self._check_free(ref.name, aliases)
        downloaded = fetch_model(ref, access, max_bytes=max_bytes)
        old = self._get(ref.name)
        entry = _entry(downloaded, tuple(dict.fromkeys(
            (*(old.aliases if old else ()), *aliases))))
        self._write(entry)
        return entry

    def remove(self, name: str) -> StoreEntry:
        """Remove a model (by name or alias) and the cached files no other model uses."""
        entry = self.find(name)
        (self.manifests / _manifest_name(entry.name)).unlink()
        used = {p for other in self.entries() for p in other.paths}
        for path in entry.paths:
            if path not in used:
                discard(Path(path))
        return entry

    def _get(self, name: str) -> StoreEntry | None:
        return next((e for e in self.entries() if e.name == name), None)

    def _check_free(self, name: str, aliases: tuple[str, ...]) -> None:
        for entry in self.entries():
            taken = set(entry.names) & set(aliases) if entry.name != name else set()
            if taken:
                raise InvalidOptionError(f"alias {sorted(taken)[0]!r} already names "
                                         f"{entry.name}", option="alias")

    def _write(self, entry: StoreEntry) -> None:
        self.manifests.mkdir(parents=True, exist_ok=True)
        final = self.manifests / _manifest_name(entry.name)
        fd, tmp = tempfile.mkstemp(dir=self.manifests, prefix=".pull-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry.to_json(), f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _hub_name(name: str) -> str | None:
    try:
        return parse_model_ref(name, option="model").name
    except InvalidOptionError:
        return None


def _entry(downloaded: Downloaded, aliases: tuple[str, ...]) -> StoreEntry:
    return StoreEntry(
        name=downloaded.ref.name, repo=downloaded.ref.repo, tag=downloaded.ref.tag,
        revision=downloaded.revision, files=tuple(f.path for f in downloaded.files),
        sha256=tuple(f.sha256 for f in downloaded.files),
        paths=tuple(str(p) for p in downloaded.paths), size=downloaded.size,
        modified=datetime.now(timezone.utc).isoformat(timespec="seconds"), aliases=aliases)
