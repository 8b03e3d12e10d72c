"""The images and audio of a conversation, taken out of its messages for the projector.

Every chat API translates its media into OpenAI's content parts: ``image_url`` (a data URL, or
the URL as a string) and ``input_audio`` (``{"data": base64, "format"}``). :func:`take_media`
replaces each such part with a ``media_marker`` part holding the marker (joined to the text
around it without newlines, as llama-server joins it), and
returns the decoded bytes in order: the template renders the marker where the media was, and
the projector's tokenizer puts each item's embeddings there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llamapy.errors import MediaError
from llamapy.media.sources import MediaBudget, MediaFetch, media_from_base64, media_from_url
from llamapy.options.limits import RequestLimits

__all__ = ["MEDIA_MARKER", "MEDIA_PART_TYPES", "mark_media", "take_media"]

#: What stands for one media item in a rendered prompt (libmtmd's default marker).
MEDIA_MARKER = "<__media__>"
#: The content part types that carry media.
MEDIA_PART_TYPES = frozenset({"image_url", "input_audio"})


def take_media(messages: tuple[Mapping[str, Any], ...], limits: RequestLimits,
               fetch: MediaFetch | None = None, budget: MediaBudget | None = None
               ) -> tuple[tuple[Mapping[str, Any], ...], list[bytes]]:
    """``messages`` with each media part replaced by a marker part, and the media's bytes in
    order (the messages as they are when they hold none); ``fetch`` says where else than the
    request media may come from (default: nowhere). :class:`~llamapy.errors.MediaError` for
    media that cannot be read or is past ``limits`` (count and bytes; formats and pixels are
    checked when it is encoded); ``budget`` counts the items of a request that holds several
    conversations."""
    fetch = fetch or MediaFetch(limits.max_media_bytes)
    budget = budget or MediaBudget(limits.max_media_items)
    media: list[bytes] = []
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not any(_is_media(p) for p in content):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            if _is_media(part):
                budget.take()
                media.append(_bytes(part, fetch, f"messages[{i}].content[{j}]"))
                part = {"type": "media_marker", "text": MEDIA_MARKER}
            parts.append(part)
        out.append({**message, "content": parts})
    return (tuple(out) if media else messages), media


def mark_media(messages: tuple[Mapping[str, Any], ...]) -> tuple[Mapping[str, Any], ...]:
    """``messages`` with each media part replaced by a marker part, the media not read (a
    prompt rendered to be shown, as llama-server's ``/apply-template`` shows it)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(_is_media(p) for p in content):
            message = {**message, "content": [
                {"type": "media_marker", "text": MEDIA_MARKER} if _is_media(p) else p
                for p in content]}
        out.append(message)
    return tuple(out)


def _is_media(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("type") in MEDIA_PART_TYPES


def _bytes(part: Mapping[str, Any], fetch: MediaFetch, where: str) -> bytes:
    if part["type"] == "image_url":
        source = part.get("image_url")
        url = source.get("url") if isinstance(source, Mapping) else source
        return media_from_url(url, fetch, f"{where}.image_url")
    audio = part.get("input_audio")
    if not isinstance(audio, Mapping):
        raise MediaError(f"{where}.input_audio must be an object with data and format",
                         reason="format")
    return media_from_base64(audio.get("data"), fetch.max_bytes, f"{where}.input_audio.data")
