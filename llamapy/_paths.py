"""Where llamapy keeps downloads, builds and models (never inside the git checkout)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache root: ``$LLAMAPY_CACHE`` or ``~/.cache/llamapy``."""
    env = os.environ.get("LLAMAPY_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llamapy"


def current_build_file() -> Path:
    """The JSON file naming the build that ``build_lib.py`` made most recently."""
    return cache_dir() / "current.json"


def current_build() -> dict[str, str] | None:
    """The record of the current build (``lib_dir``, ``build_dir``, ``key``...), if any."""
    path = current_build_file()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
