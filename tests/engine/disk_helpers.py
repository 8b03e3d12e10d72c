"""Shared by the disk prompt cache's tests: a key, a namespace, a prompt, fake states and a
small cache on a folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llamapy.engine.cache.disk import CacheNamespace, DiskPromptCache
from llamapy.engine.cache.disk_store import SUFFIX
from llamapy.engine.request import CacheKey

K = CacheKey("tenant-a", "", ())
NS = CacheNamespace("model-A")
TOKENS = tuple(range(1, 101))


def state(n: int, fill: int = 7) -> bytes:
    return bytes([fill]) * n


def sized(data: bytes) -> tuple[Callable[[], int], Callable[[], bytes]]:
    return (lambda: len(data)), (lambda: data)


def cache(folder: Path, budget: int = 1 << 20, *, namespace: CacheNamespace = NS,
          background: bool = False, **kw) -> DiskPromptCache:
    return DiskPromptCache(folder, budget, namespace=namespace, min_tokens=4,
                           background=background, **kw)


def entry_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*" + SUFFIX))
