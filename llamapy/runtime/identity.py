"""What makes serialised KV valid to restore, from the host's side: the disk prompt cache's
namespace digest (see :class:`~llamapy.engine.cache.disk.CacheNamespace`) and the description
of an adapter set by its files' fingerprints (:func:`llamapy.fingerprint.model_fingerprint`,
the one fingerprint sessions and slot files use too).

KV restored into a context is only right if the same weights, tokenizer, KV layout and
libllama computed it. The engine cannot know those; the host that loaded the model does, and
names them in one digest. Pure functions of plain values (no binding import): hosting code
(:mod:`llamapy.runtime.native`) gathers the values from the loaded model and context.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Hashable, Mapping
from typing import Any

from llamapy.fingerprint import model_fingerprint

__all__ = ["describe_adapter_files", "namespace_digest"]


def namespace_digest(parts: Mapping[str, Any]) -> str:
    """The sha256 of the namespace parts (canonical JSON; values rendered with ``str``)."""
    text = json.dumps(dict(parts), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def describe_adapter_files(adapter_set: tuple[Hashable, ...]) -> str:
    """An adapter set of ``(path, scale)`` pairs as the adapters' fingerprints and scales (an
    adapter file replaced under the same path is another adapter). Other items: their repr."""
    out: list[Any] = []
    for item in adapter_set:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str | os.PathLike):
            path, scale = item
            try:
                out.append([model_fingerprint(path), float(scale)])
            except OSError:
                out.append(["missing", os.fspath(path), float(scale)])
        else:
            out.append(repr(item))
    return json.dumps(out)
