"""A local stand-in for the parts of the Hugging Face Hub that huggingface_hub calls here.

- ``GET /api/models/{org}/{repo}[/revision/{rev}]``: ``id``, ``sha`` and ``siblings`` with
  ``size``, ``blobId`` and ``lfs`` (``sha256``, ``size``, ``pointerSize``) — what
  ``HfApi.model_info(files_metadata=True)`` reads;
- ``HEAD`` / ``GET /{org}/{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (an LFS
  file's is its sha256, with ``X-Linked-Etag`` / ``X-Linked-Size``), ``Content-Length``, and
  ``Range: bytes=N-`` answered with 206 — what ``hf_hub_download`` reads;
- Hub errors as huggingface_hub maps them: 404 with ``X-Error-Code`` ``RepoNotFound`` /
  ``EntryNotFound`` / ``RevisionNotFound``, 401 ``GatedRepo`` for a gated repository without
  its token.

A :class:`Repo`'s file may be marked ``corrupt`` (the listing advertises a sha256 its bytes do
not have) or ``drop_once`` (the first GET sends half the body, then closes the connection).
Every request is recorded in :attr:`HubStandin.requests`. :data:`TINY` is the fake repository
most tests serve (its helpers live here, not in ``conftest``, whose module name other test
folders share).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_SHA_CACHE: dict[Path, str] = {}


def file_sha256(path: Path) -> str:
    """The sha256 of a file (computed once per process)."""
    if path not in _SHA_CACHE:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        _SHA_CACHE[path] = digest.hexdigest()
    return _SHA_CACHE[path]


@dataclass
class Repo:
    """A repository: path -> bytes (or a file on disk); every file but ``*.md`` is LFS."""

    files: dict[str, bytes | Path]
    commit: str = "c" * 40
    corrupt: set[str] = field(default_factory=set)
    drop_once: set[str] = field(default_factory=set)
    token: str = ""  # a gated repository: this bearer token is required

    def size(self, name: str) -> int:
        data = self.files[name]
        return data.stat().st_size if isinstance(data, Path) else len(data)

    def sha256(self, name: str) -> str:
        data = self.files[name]
        real = file_sha256(data) if isinstance(data, Path) else hashlib.sha256(data).hexdigest()
        return "0" * 64 if name in self.corrupt else real

    def blob_id(self, name: str) -> str:
        data = self.files[name]
        body = data.read_bytes() if isinstance(data, Path) else data
        return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()

    def is_lfs(self, name: str) -> bool:
        return not name.endswith(".md")

    def sibling(self, name: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"rfilename": name, "size": self.size(name)}
        if self.is_lfs(name):
            entry["blobId"] = "b" * 40
            entry["lfs"] = {"sha256": self.sha256(name), "size": self.size(name),
                            "pointerSize": 134}
        else:
            entry["blobId"] = self.blob_id(name)
        return entry


_API = re.compile(r"^/api/models/([^/]+/[^/?]+)(?:/revision/([^/?]+))?(?:\?.*)?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/([^?]+)(?:\?.*)?$")


class HubStandin:
    """The server: ``repos`` by id, ``url`` once started; a context manager."""

    def __init__(self, repos: dict[str, Repo]) -> None:
        self.repos = repos
        #: (method, path, headers with lower-case names) of every request
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.dropped: set[tuple[str, str]] = set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubStandin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving (idempotent): the endpoint refuses connections afterwards."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def file_requests(self, name: str) -> list[tuple[str, dict[str, str]]]:
        """``(method, headers)`` of the requests for a file (any revision)."""
        return [(m, h) for m, p, h in self.requests
                if "/resolve/" in p and p.endswith("/" + name)]


class _Handler(BaseHTTPRequestHandler):
    """The stand-in's request handler; :func:`_handler` binds it to one :class:`HubStandin`."""

    hub: HubStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._route(body=True)

    def do_HEAD(self) -> None:
        self._route(body=False)

    def _route(self, body: bool) -> None:
        self.hub.requests.append((self.command, self.path,
                             {k.lower(): v for k, v in self.headers.items()}))
        api, resolve = _API.match(self.path), _RESOLVE.match(self.path)
        if api:
            self._api(api.group(1), body)
        elif resolve:
            self._resolve(resolve.group(1), resolve.group(2), resolve.group(3), body)
        else:
            self._error(404, "RepoNotFound", "", body)

    def _repo(self, repo_id: str, body: bool) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "", body)
            return None
        if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(401, "GatedRepo", repo.commit, body)
            return None
        return repo

    def _api(self, repo_id: str, body: bool) -> None:
        repo = self._repo(repo_id, body)
        if repo is None:
            return
        data = json.dumps({"id": repo_id, "sha": repo.commit, "private": False,
                           "lastModified": "2026-01-01T00:00:00.000Z",
                           "siblings": [repo.sibling(n) for n in repo.files]}).encode()
        self._send(200, {"Content-Type": "application/json"}, data if body else b"",
                   len(data))

    def _resolve(self, repo_id: str, revision: str, name: str, body: bool) -> None:
        repo = self._repo(repo_id, body)
        if repo is None:
            return
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "", body)
            return
        if name not in repo.files:
            self._error(404, "EntryNotFound", repo.commit, body)
            return
        size, start = repo.size(name), self._range_start()
        headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if repo.is_lfs(name):
            headers |= {"ETag": f'"{repo.sha256(name)}"',
                        "X-Linked-Etag": f'"{repo.sha256(name)}"',
                        "X-Linked-Size": str(size)}
        else:
            headers["ETag"] = f'"{repo.blob_id(name)}"'
        if not body:
            self._send(200, headers, b"", size)
            return
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        self._stream(repo, name, status, headers, start)

    def _range_start(self) -> int:
        match = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
        return int(match.group(1)) if match else 0

    def _stream(self, repo: Repo, name: str, status: int, headers: dict[str, str],
                start: int) -> None:
        data = repo.files[name]
        raw = data.read_bytes() if isinstance(data, Path) else data
        chunk = raw[start:]
        drop = name in repo.drop_once and (repo.commit, name) not in self.hub.dropped
        self._send(status, headers, b"", len(chunk))
        if drop:
            self.hub.dropped.add((repo.commit, name))
            self.wfile.write(chunk[: len(chunk) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(chunk)

    def _error(self, status: int, code: str, commit: str, body: bool) -> None:
        data = json.dumps({"error": code}).encode()
        headers = {"X-Error-Code": code, "Content-Type": "application/json"}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(status, headers, data if body else b"", len(data))

    def _send(self, status: int, headers: dict[str, str], data: bytes,
              length: int) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if data:
            self.wfile.write(data)


def _handler(hub: HubStandin) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"hub": hub})


#: The fake repository of small files: a projector named with the default tag (listed first,
#: never chosen), two quants, a split F16 in two parts, a non-LFS README.
TINY = "org/tiny-GGUF"


def tiny_files() -> dict[str, bytes | Path]:
    """The files of :data:`TINY` (small bytes that only look like GGUFs by name)."""
    return {
        "mmproj-tiny-Q4_K_M.gguf": b"GGUF-projector" * 10,
        "tiny-Q8_0.gguf": b"GGUF-q8" * 300,
        "tiny-Q4_K_M.gguf": b"GGUF-q4km" * 20_000,
        "tiny-F16-00002-of-00002.gguf": b"GGUF-f16-b" * 50,
        "tiny-F16-00001-of-00002.gguf": b"GGUF-f16-a" * 50,
        "README.md": b"# tiny\n",
    }


def blobs(hf_home: Path) -> list[Path]:
    """Every file in the cache's blob folders (a file half written would be one too)."""
    return sorted(p for p in (hf_home / "hub").rglob("blobs/*") if p.is_file())
