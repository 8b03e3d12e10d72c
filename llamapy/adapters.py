"""The ``adapters`` request option: a LoRA adapter set per request.

:func:`resolve_adapters` validates and normalises it in the caller's thread (so a bad value or a
missing file fails that submission at once, before anything reaches the tick thread) into the
engine's opaque adapter set ``((absolute path, scale), ...)``. The tick thread then loads the
files (once per server, cached by path; see :meth:`~llamapy.llama_backend.LlamaBackend.
load_adapters`), and the engine never batches or reuses KV across different sets.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from .errors import InvalidOptionError, ModelLoadError

__all__ = ["AdapterSet", "resolve_adapters"]

#: The engine's adapter set as the server builds it: ``((absolute path, scale), ...)``.
AdapterSet = tuple[tuple[str, float], ...]

_DICT_KEYS = frozenset({"path", "scale"})


def _fail(message: str) -> InvalidOptionError:
    return InvalidOptionError(f"adapters: {message}", option="adapters")


def resolve_adapters(value: object) -> AdapterSet:
    """``value`` as an adapter set, in the given order (``None`` or empty: the base model).

    Items are ``(path, scale)`` pairs, ``{"path": ..., "scale": ...}`` dicts or objects with
    ``path`` and ``scale`` attributes (such as ``AdapterSpec``); ``scale`` defaults to 1.0 in
    dicts. Raises ``InvalidOptionError`` for a malformed value (a bare string, a non-finite
    scale, the same file twice) and ``ModelLoadError`` for a file that does not exist.
    """
    if value is None:
        return ()
    if isinstance(value, str | bytes | os.PathLike | Mapping) or not isinstance(value, Iterable):
        raise _fail("expected a sequence of (path, scale) pairs or {path, scale} objects")
    out: list[tuple[str, float]] = []
    for item in value:
        path, scale = _path_and_scale(item)
        if path in (p for p, _ in out):
            raise _fail(f"{path} is listed twice")
        out.append((path, scale))
    return tuple(out)


def _path_and_scale(item: object) -> tuple[str, float]:
    if isinstance(item, Mapping):
        if "path" not in item or set(item) - _DICT_KEYS:
            raise _fail(f"{dict(item)!r} must have a 'path' and optionally a 'scale'")
        raw_path, scale = item["path"], item.get("scale", 1.0)
    elif hasattr(item, "path") and hasattr(item, "scale"):
        raw_path, scale = item.path, item.scale
    elif isinstance(item, list | tuple) and len(item) == 2:
        raw_path, scale = item
    else:
        raise _fail(f"{item!r} is not a (path, scale) pair")
    return _path(raw_path), _scale(scale)


def _path(raw: object) -> str:
    if not isinstance(raw, str | os.PathLike) or not str(raw):
        raise _fail(f"path {raw!r} must be a non-empty string or path")
    path = Path(raw).expanduser().resolve()
    if not path.is_file():
        raise ModelLoadError(f"LoRA adapter not found: {path}")
    return str(path)


def _scale(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, numbers.Real) or not math.isfinite(raw):
        raise _fail(f"scale {raw!r} must be a finite number")
    return float(raw)

