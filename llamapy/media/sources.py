"""Media bytes from what a request sends, bounded before they are decoded.

An image URL may be a ``data:`` URL, bare base64 (llama-server takes both), a ``file://`` URL
relative to the folder the server allows (``media_path``: llama-server's ``--media-path``), or
an ``http(s)`` URL, fetched only when the server allows it (``media_remote``, off by default:
the server fetches nothing a request names unless told to), within ``max_bytes`` and
:data:`REMOTE_TIMEOUT_S` for the whole download, from checked addresses only (:mod:`.remote`).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path

from llamapy.errors import MediaError

from .remote import download

__all__ = ["REMOTE_TIMEOUT_S", "MediaBudget", "MediaFetch", "media_from_base64",
           "media_from_url"]

#: Seconds a remote media download may take in all (llama-server's 10).
REMOTE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class MediaFetch:
    """Where media may come from besides the request itself: ``remote`` http(s) URLs (on
    public addresses only, unless ``private``: loopback, private, link-local and reserved
    addresses too), and ``folder`` for ``file://`` URLs (None: none); ``max_bytes`` bounds an
    item."""

    max_bytes: int
    remote: bool = False
    folder: str | None = None
    timeout_s: float = REMOTE_TIMEOUT_S
    private: bool = False


@dataclass(slots=True)
class MediaBudget:
    """The media one HTTP request may send, all its prompts and inputs together."""

    max_items: int
    used: int = 0

    def take(self) -> None:
        """Count one more item; :class:`~llamapy.errors.MediaError` past ``max_items``."""
        self.used += 1
        if self.used > self.max_items:
            raise MediaError(f"at most {self.max_items} images and audio clips per request",
                             reason="too_many")


def media_from_base64(data: object, max_bytes: int, where: str) -> bytes:
    """The bytes of base64 text ``data`` (standard alphabet, padding optional);
    :class:`~llamapy.errors.MediaError` for text that is not base64 or holds more than
    ``max_bytes``."""
    if not isinstance(data, str) or not data:
        raise MediaError(f"{where}: expected base64 text", reason="format")
    if len(data) // 4 * 3 > max_bytes + 3:
        raise MediaError(f"{where}: the media is larger than the {max_bytes} bytes allowed",
                         reason="too_large")
    text = "".join(data.split())
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{where}: the media is not valid base64", reason="format") from None


def media_from_url(url: object, fetch: MediaFetch, where: str) -> bytes:
    """The bytes an image URL names (see the module); :class:`~llamapy.errors.MediaError`
    for one the server may not read, cannot read, or that is too large."""
    if not isinstance(url, str) or not url:
        raise MediaError(f"{where}: expected a data URL", reason="format")
    scheme = url[:8].lower()
    if scheme.startswith(("http://", "https://")):
        if not fetch.remote:
            raise MediaError(f"{where}: remote media URLs are not fetched here (start the "
                             "server with --media-remote); send the media inline as a data "
                             "URL (data:image/png;base64,...)", reason="remote")
        return download(url, fetch, where)
    if scheme.startswith("file://"):
        return _local(url[7:], fetch, where)
    if scheme.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep or not head.lower().endswith(";base64"):
            raise MediaError(f"{where}: expected a base64 data URL (data:<type>;base64,...)",
                             reason="format")
        return media_from_base64(payload, fetch.max_bytes, where)
    return media_from_base64(url, fetch.max_bytes, where)  # bare base64, as llama-server


def _local(name: str, fetch: MediaFetch, where: str) -> bytes:
    """A file of the allowed folder, by a name relative to it (or an absolute one inside it:
    ``file:///srv/media/a.png``), at most ``fetch.max_bytes`` read."""
    if fetch.folder is None:
        raise MediaError(f"{where}: file:// URLs need the server's --media-path",
                         reason="remote")
    try:
        folder = Path(fetch.folder).resolve()
        path = (folder / name).resolve()  # (an absolute name replaces the folder)
        if not name or "\x00" in name or not path.is_relative_to(folder) or not path.is_file():
            raise FileNotFoundError(name)
        with path.open("rb") as f:
            data = f.read(fetch.max_bytes + 1)
    except (OSError, ValueError):
        raise MediaError(f"{where}: no such file in the media folder: {name!r}",
                         reason="remote") from None
    if len(data) > fetch.max_bytes:
        raise MediaError(f"{where}: the file is larger than the {fetch.max_bytes} bytes "
                         "allowed", reason="too_large")
    return data
