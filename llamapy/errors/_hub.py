"""Errors of getting a model by name: from the Hugging Face Hub (:mod:`llamapy.hub`) and the
local store. A name that resolves to nothing is a :class:`ModelNotFoundError` (404); a Hub that
cannot be reached or answers badly is a :class:`HubError` (502); a pull the server's limits
refuse is a :class:`PullRefusedError` (403)."""

from __future__ import annotations

from llamapy.errors._tree import LlamapyError, ModelNotFoundError


class HubError(LlamapyError):
    """The Hub could not be reached, refused the request (a gated or private repository without
    a token) or answered something unusable; ``repo`` names the repository."""

    http_status = 502

    def __init__(self, message: str, repo: str = "") -> None:
        self.repo = repo
        super().__init__(message)


class HubModelNotFoundError(ModelNotFoundError):
    """A repository, a quant tag or a file that does not exist (on the Hub, or in the cache
    when offline); ``available`` lists the GGUF files there are, when known."""

    def __init__(self, message: str, repo: str = "", available: tuple[str, ...] = ()) -> None:
        self.repo = repo
        self.available = available
        if available:
            message += f"; GGUF files: {', '.join(available)}"
        super().__init__(message)


class OfflineModelMissingError(HubModelNotFoundError):
    """Offline (no network at all) and the model is not in the local cache."""


class ChecksumMismatchError(HubError):
    """A downloaded file's sha256 differs from the Hub's record of it; the file was deleted."""

    def __init__(self, repo: str, path: str, expected: str, got: str) -> None:
        self.path = path
        self.expected = expected
        self.got = got
        super().__init__(f"{repo}/{path}: sha256 {got} differs from the Hub's {expected}; "
                         "the download was deleted", repo=repo)


class PullRefusedError(LlamapyError):
    """A pull that a request asked for and the server's limits refuse, before any byte is
    downloaded: a repository outside ``--pull-allow``, or files over ``--pull-max-bytes``
    (``size`` and ``limit`` then; ``size`` None when the Hub's listing gives none)."""

    http_status = 403
    error_type = "permission_error"

    def __init__(self, message: str, repo: str = "", size: int | None = None,
                 limit: int | None = None) -> None:
        self.repo = repo
        self.size = size
        self.limit = limit
        super().__init__(message)


class StoreEntryNotFoundError(ModelNotFoundError):
    """The local model store has no model of that name or alias."""

    def __init__(self, name: str, known: tuple[str, ...] = ()) -> None:
        self.name = name
        self.known = known
        super().__init__(f"no model {name!r} in the store; pulled: {', '.join(known) or '(none)'}")
