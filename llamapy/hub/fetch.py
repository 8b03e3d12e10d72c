"""Download a named model from the Hugging Face Hub into huggingface_hub's cache, verified.

Every Hub call goes through ``huggingface_hub`` (its cache layout, resumable downloads with
``Range``, progress bars, ``local_files_only``); this module is the one boundary where its
errors become llamapy's (:func:`_translated`). The policy:

1. Online, the repository's file listing with LFS metadata (``model_info(files_metadata=True)``)
   is read once; the files are chosen by :func:`llamapy.hub.select.choose_files` and each is
   downloaded at that listing's commit, so every part comes from one revision. With a byte
   cap (``max_bytes``: a pull a request caused, ``--pull-max-bytes``) the chosen files' sizes
   in that listing are summed first, and a sum over the cap (or a file the listing gives no
   size for) raises :class:`~llamapy.errors.PullRefusedError` before any file is requested.
2. Each downloaded file is hashed and compared with the Hub's LFS sha256 (a small non-LFS file
   with its git blob id); a mismatch deletes the file from the cache and raises
   :class:`~llamapy.errors.ChecksumMismatchError`. huggingface_hub writes to a temporary
   ``.incomplete`` name and renames, so a broken transfer never leaves a file that looks whole.
3. Offline (``--offline``, ``HF_HUB_OFFLINE``) nothing touches the network: the listing is the
   cached snapshot's (the ``main`` revision's, else the newest), and a model not cached raises
   :class:`~llamapy.errors.OfflineModelMissingError`.

:class:`HubAccess` reads ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_CACHE`` / ``HF_HOME`` and
``HF_HUB_OFFLINE`` when it is made, not when huggingface_hub was imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._paths import sha256_file
from ..errors import (
    ChecksumMismatchError,
    HubError,
    HubModelNotFoundError,
    InvalidOptionError,
    LlamapyError,
    OfflineModelMissingError,
    PullRefusedError,
)
from ..options.hub import ModelRef, check_hf_token
from .select import choose_files

__all__ = ["Downloaded", "HubAccess", "HubFile", "check_download_size", "fetch_model",
           "hub_cache_dir"]

_TRUE = ("1", "on", "yes", "true")


def hub_cache_dir() -> Path:
    """huggingface_hub's cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home).expanduser() / "hub"


@dataclass(frozen=True, slots=True)
class HubAccess:
    """How to reach the Hub: endpoint (None: huggingface.co), token, cache, offline."""

    endpoint: str | None = None
    token: str | None = None
    cache_dir: Path | None = None
    offline: bool = False

    @classmethod
    def from_env(cls, token: str = "", offline: bool = False) -> HubAccess:
        """The access the environment describes; ``token`` / ``offline`` (flags) win."""
        endpoint = os.environ.get("HF_ENDPOINT", "").rstrip("/") or None
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise InvalidOptionError(f"HF_ENDPOINT: expected an http(s) URL, got {endpoint!r}",
                                     option="HF_ENDPOINT")
        offline = offline or os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE
        if not token and os.environ.get("HF_TOKEN"):
            token = check_hf_token(os.environ["HF_TOKEN"], option="HF_TOKEN")
        return cls(endpoint=endpoint, token=token or None, cache_dir=hub_cache_dir(),
                   offline=offline)


@dataclass(frozen=True, slots=True)
class HubFile:
    """A file of a repository: its path, size and checksums ("" when unknown)."""

    path: str
    size: int | None = None
    sha256: str = ""
    blob_id: str = ""


@dataclass(frozen=True, slots=True)
class Downloaded:
    """A model in the local cache: the files chosen (first part first) and where they are."""

    ref: ModelRef
    revision: str
    files: tuple[HubFile, ...]
    paths: tuple[Path, ...]

    @property
    def path(self) -> Path:
        """The file to load (a split GGUF's first part; its other parts lie beside it)."""
        return self.paths[0]

    @property
    def size(self) -> int:
        """Bytes on disk, all parts."""
        return sum(p.stat().st_size for p in self.paths)


def fetch_model(ref: ModelRef, access: HubAccess, hf_file: str = "", max_bytes: int = 0
                ) -> Downloaded:
    """``ref``'s file(s), downloaded and verified unless cached (see the module's policy);
    ``max_bytes`` > 0 caps their listed size, checked before anything downloads."""
    with _translated(ref.repo, access.offline):
        if access.offline:
            return _from_cache(ref, access, hf_file)
        revision, listing = _listing(ref.repo, access)
        chosen = choose_files(ref.repo, list(listing), ref.tag, hf_file)
        files = tuple(listing[p] for p in chosen)
        check_download_size(ref, files, max_bytes)
        paths = tuple(_download(ref.repo, revision, f, access) for f in files)
        return Downloaded(ref, revision, files, paths)


def check_download_size(ref: ModelRef, files: tuple[HubFile, ...], max_bytes: int) -> None:
    """Raise :class:`PullRefusedError` when ``files`` (sizes from the Hub's listing) add up
    to more than ``max_bytes``, or one has no listed size; nothing when ``max_bytes`` is 0."""
    if max_bytes <= 0:
        return
    unsized = [f.path for f in files if f.size is None]
    if unsized:
        raise PullRefusedError(f"{ref.name}: the Hub's listing gives no size for "
                               f"{unsized[0]!r}, so the pull cannot be checked against the "
                               f"server's limit of {max_bytes} bytes (--pull-max-bytes)",
                               repo=ref.repo, limit=max_bytes)
    total = sum(f.size or 0 for f in files)
    if total > max_bytes:
        raise PullRefusedError(f"{ref.name}: its files are {total} bytes, over the server's "
                               f"limit of {max_bytes} bytes for a pull (--pull-max-bytes)",
                               repo=ref.repo, size=total, limit=max_bytes)


def _listing(repo: str, access: HubAccess) -> tuple[str, dict[str, HubFile]]:
    from huggingface_hub import HfApi

    info = HfApi(endpoint=access.endpoint, token=access.token).model_info(
        repo, files_metadata=True)
    if not info.sha or info.siblings is None:
        raise HubError(f"{repo}: the Hub's answer has no commit or file listing", repo=repo)
    files = {s.rfilename: HubFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else "",
                                  s.blob_id or "") for s in info.siblings}
    return info.sha, files


def _download(repo: str, revision: str, file: HubFile, access: HubAccess) -> Path:
    from huggingface_hub import hf_hub_download

    path = Path(hf_hub_download(repo, file.path, revision=revision, cache_dir=access.cache_dir,
                                endpoint=access.endpoint, token=access.token))
    _verify(repo, file, path)
    return path


def _git_blob_id(path: Path) -> str:
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size, usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _verify(repo: str, file: HubFile, path: Path) -> None:
    """Compare ``path`` with the Hub's checksum of ``file``; delete it on a mismatch."""
    if file.sha256:
        expected, got = file.sha256, sha256_file(path)
    elif file.blob_id:
        expected, got = file.blob_id, _git_blob_id(path)
    else:
        return
    if got != expected:
        discard(path)
        raise ChecksumMismatchError(repo, file.path, expected, got)


def discard(path: Path) -> None:
    """Remove a cached file: its snapshot link and the blob it points to."""
    blob = path.resolve()
    path.unlink(missing_ok=True)
    if blob != path:
        blob.unlink(missing_ok=True)


def _from_cache(ref: ModelRef, access: HubAccess, hf_file: str) -> Downloaded:
    """The model from the cache alone (no network): the ``main`` snapshot, else the newest."""
    from huggingface_hub import hf_hub_download

    revision, names = _cached_snapshot(ref.repo, access)
    try:
        chosen = choose_files(ref.repo, names, ref.tag, hf_file)
    except HubModelNotFoundError as exc:
        raise OfflineModelMissingError(f"offline (--offline), and the local cache: {exc}",
                                       repo=ref.repo) from None
    paths = tuple(Path(hf_hub_download(ref.repo, name, revision=revision,
                                       cache_dir=access.cache_dir, local_files_only=True))
                  for name in chosen)
    return Downloaded(ref, revision, tuple(HubFile(n) for n in chosen), paths)


def _cached_snapshot(repo: str, access: HubAccess) -> tuple[str, list[str]]:
    from huggingface_hub import scan_cache_dir

    cache = access.cache_dir or hub_cache_dir()
    repos = [r for r in scan_cache_dir(cache).repos if r.repo_id == repo and
             r.repo_type == "model"] if cache.is_dir() else []
    revisions = sorted((rev for r in repos for rev in r.revisions),
                       key=lambda rev: ("main" in rev.refs, rev.last_modified), reverse=True)
    if not revisions:
        raise OfflineModelMissingError(f"{repo} is not in the local cache ({cache}) and "
                                       "the network is off (--offline)", repo=repo)
    rev = revisions[0]
    names = sorted(str(f.file_path.relative_to(rev.snapshot_path)) for f in rev.files)
    return rev.commit_hash, names


@contextlib.contextmanager
def _translated(repo: str, offline: bool) -> Iterator[None]:
    """huggingface_hub's and the network's errors as llamapy's (the one boundary)."""
    from huggingface_hub import errors as hf

    try:
        yield
    except LlamapyError:
        raise
    except hf.GatedRepoError as exc:
        raise HubError(f"{repo} is gated: accept its terms on the Hub and pass a token "
                       f"(--hf-token or HF_TOKEN) ({_first_line(exc)})", repo=repo) from None
    except (hf.RepositoryNotFoundError, hf.RevisionNotFoundError) as exc:
        raise HubModelNotFoundError(f"no repository {repo} on the Hub (or it is private: "
                                    f"pass a token) ({_first_line(exc)})", repo=repo) from None
    except hf.EntryNotFoundError as exc:
        kind = OfflineModelMissingError if offline else HubModelNotFoundError
        raise kind(f"{repo}: file not found ({_first_line(exc)})", repo=repo) from None
    except (hf.HfHubHTTPError, OSError, ValueError) as exc:
        raise HubError(f"{repo}: {_first_line(exc)}", repo=repo) from None
    except Exception as exc:
        if _is_transport_error(exc):
            raise HubError(f"{repo}: the Hub could not be reached: {_first_line(exc)}",
                           repo=repo) from None
        raise


def _is_transport_error(exc: BaseException) -> bool:
    """An HTTP client's network error (huggingface_hub's client is httpx-like)."""
    return any(c.__name__ in ("HTTPError", "TransportError", "RequestError")
               for c in type(exc).__mro__)


def _first_line(exc: Any) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
