"""Media bytes from what a request sends: a ``data:`` URL or bare base64, bounded before it is
decoded (the decoded size is known from the text's length). Remote ``http(s)`` URLs are refused:
the server fetches nothing a request names."""

from __future__ import annotations

import base64
import binascii

from llamapy.errors import MediaError

__all__ = ["media_from_base64", "media_from_url"]


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


def media_from_url(url: object, max_bytes: int, where: str) -> bytes:
    """The bytes of a ``data:<type>;base64,<data>`` URL; a remote URL or another scheme is a
    :class:`~llamapy.errors.MediaError` (reason ``"remote"`` or ``"format"``)."""
    if not isinstance(url, str) or not url:
        raise MediaError(f"{where}: expected a data URL", reason="format")
    scheme = url[:8].lower()
    if scheme.startswith(("http://", "https://")):
        raise MediaError(f"{where}: remote media URLs are not fetched; send the media inline "
                         "as a data URL (data:image/png;base64,...)", reason="remote")
    head, sep, payload = url.partition(",")
    if not head.lower().startswith("data:") or not sep or not head.lower().endswith(";base64"):
        raise MediaError(f"{where}: expected a base64 data URL (data:<type>;base64,...)",
                         reason="format")
    return media_from_base64(payload, max_bytes, where)
