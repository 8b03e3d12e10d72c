"""llama-server's rules for choosing the GGUF file(s) of a repository by quant tag.

- A *model file* ends in ``.gguf`` and its name contains none of ``mmproj``, ``imatrix``,
  ``mtp-``, ``eagle3-``, ``dflash-``, ``dspark-`` (projectors and draft heads are never chosen).
- With a tag, the first model file (in the listing's order) whose path contains the tag followed
  by ``.`` or ``-``, without regard to case, is chosen; no tag tries ``Q4_K_M``, then ``Q8_0``,
  then takes the first model file. A tag that matches nothing is an error (no fallback).
- A split GGUF (``NAME-00001-of-00003.gguf``) is chosen by its first part, and all its parts
  (same prefix, same count) are downloaded.
- ``-hff FILE`` names the file outright (it must exist; its split parts come along).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import HubModelNotFoundError

__all__ = ["DEFAULT_TAGS", "NOT_MODELS", "SplitInfo", "choose_files", "is_model_file",
           "split_info"]

#: The tags tried, in order, when a name has none.
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
#: Substrings of a file name that mark a GGUF as something other than a model.
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")

_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class SplitInfo:
    """A GGUF path's split prefix (tag included), part index and part count (1 of 1 when
    whole)."""

    prefix: str
    index: int = 1
    count: int = 1


def split_info(path: str) -> SplitInfo:
    """The split parts of ``path`` (``x-00002-of-00003.gguf``: prefix ``x``, 2 of 3)."""
    stem = path[:-5] if path.lower().endswith(".gguf") else path
    match = _SPLIT.match(stem)
    if match is None:
        return SplitInfo(stem)
    return SplitInfo(match.group(1), int(match.group(2)), int(match.group(3)))


def is_model_file(path: str) -> bool:
    """A ``.gguf`` whose file name marks no projector, imatrix or draft head."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(word in name for word in NOT_MODELS)


def _first_part(path: str) -> bool:
    return split_info(path).index == 1


def _with_tag(files: Sequence[str], tag: str) -> str | None:
    pattern = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
    for path in files:
        if is_model_file(path) and _first_part(path) and pattern.search(path):
            return path
    return None


def _primary(files: Sequence[str], tag: str) -> str | None:
    for wanted in (tag,) if tag else DEFAULT_TAGS:
        found = _with_tag(files, wanted)
        if found is not None:
            return found
    if tag:
        return None
    return next((p for p in files if is_model_file(p) and _first_part(p)), None)


def _parts(files: Sequence[str], primary: str) -> list[str]:
    info = split_info(primary)
    if info.count <= 1:
        return [primary]
    parts = [p for p in files
             if (s := split_info(p)).prefix == info.prefix and s.count == info.count]
    return sorted(parts, key=lambda p: split_info(p).index)


def choose_files(repo: str, files: Sequence[str], tag: str = "", hf_file: str = ""
                 ) -> list[str]:
    """The files to download for ``tag`` (or ``hf_file``), first part first.

    Raises :class:`HubModelNotFoundError` (listing the GGUF files there are) when nothing
    matches, or when a split GGUF misses parts.
    """
    ggufs = tuple(p for p in files if p.endswith(".gguf"))
    if hf_file:
        primary = hf_file if hf_file in files else None
        what = f"file {hf_file!r}"
    else:
        primary = _primary(files, tag)
        what = f"quant tag {tag!r}" if tag else "GGUF model file"
    if primary is None:
        raise HubModelNotFoundError(f"{repo} has no {what}", repo=repo, available=ggufs)
    parts = _parts(files, primary)
    if len(parts) != split_info(primary).count:
        raise HubModelNotFoundError(
            f"{repo}: split GGUF {primary!r} has {len(parts)} of its "
            f"{split_info(primary).count} parts", repo=repo, available=ggufs)
    return parts
