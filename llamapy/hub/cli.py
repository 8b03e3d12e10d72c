"""``python -m llamapy pull|list|rm|show``: the local model store from the command line.

- ``pull NAME [--alias A]...``: download ``[hf.co/]ORG/REPO[:QUANT]`` from the Hub (or find it
  in the cache), verify it and record it in the store;
- ``list``: name, size, digest and modification time of each pulled model;
- ``rm NAME``: remove a model (by name or alias) and its cached files no other model uses;
- ``show NAME``: the model's record as JSON (source, revision, files, checksums, path) and its
  main GGUF metadata (architecture, name, size label, file type, context length, layers...).

Each takes ``--models-dir DIR`` (the store; default ``$LLAMAPY_MODELS_DIR``, else
``<llamapy cache>/store``), the folder ``python -m llamapy.serve --models-dir DIR`` serves.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import LlamapyError
from ..options.hub import check_hf_token, parse_model_ref

if TYPE_CHECKING:
    from .store import ModelStore

__all__ = ["COMMANDS", "main"]

COMMANDS = ("pull", "list", "rm", "show")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llamapy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--models-dir", metavar="DIR", default=None,
                        help="the store folder (default: $LLAMAPY_MODELS_DIR, else "
                             "<llamapy cache>/store)")
    sub = parser.add_subparsers(dest="command", required=True)
    pull = sub.add_parser("pull", parents=[common],
                          help="download a model by name into the store")
    pull.add_argument("name", help="[hf.co/]ORG/REPO[:QUANT], e.g. hf.co/org/repo:Q4_K_M")
    pull.add_argument("--alias", action="append", default=[], metavar="NAME",
                      help="a local name for the model (repeatable)")
    pull.add_argument("--hf-token", "-hft", default="", metavar="TOKEN",
                      help="Hub access token (default: $HF_TOKEN)")
    pull.add_argument("--offline", action="store_true",
                      help="no network: record the model from the local cache only")
    sub.add_parser("list", parents=[common], help="the pulled models")
    for name, text in (("rm", "remove a model and its unshared cached files"),
                       ("show", "print a model's record and GGUF metadata as JSON")):
        sub.add_parser(name, parents=[common], help=text).add_argument(
            "name", help="a name or alias")
    return parser


def _size(n: int) -> str:
    """Bytes in decimal units, as Ollama lists them (``98.4 MB``)."""
    value = float(n)
    for unit in ("B", "KB", "MB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def _list(store: ModelStore) -> None:
    rows = [("NAME", "SIZE", "DIGEST", "MODIFIED")]
    rows += [(", ".join(e.names), _size(e.size), e.digest[:12] or "-", e.modified)
             for e in store.entries()]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _gguf(path: Path) -> dict[str, object]:
    """The model's main GGUF metadata (``{"error": ...}`` when its header is unreadable)."""
    from .gguf_meta import read_gguf_metadata, summary

    try:
        return summary(read_gguf_metadata(path))
    except (LlamapyError, OSError) as exc:
        return {"error": str(exc)}


def _run(args: argparse.Namespace) -> None:
    from .fetch import HubAccess
    from .store import ModelStore

    store = ModelStore(Path(args.models_dir) if args.models_dir else None)
    if args.command == "pull":
        ref = parse_model_ref(args.name, option="name")
        token = check_hf_token(args.hf_token) if args.hf_token else ""
        entry = store.pull(ref, HubAccess.from_env(token=token, offline=args.offline),
                           tuple(args.alias))
        print(f"pulled {entry.name} ({_size(entry.size)}) -> {entry.path}")
    elif args.command == "list":
        _list(store)
    elif args.command == "rm":
        print(f"removed {store.remove(args.name).name}")
    else:
        entry = store.find(args.name)
        print(json.dumps({**entry.to_json(), "path": str(entry.path), "digest": entry.digest,
                          "gguf": _gguf(entry.path)}, indent=2))


def main(argv: Sequence[str]) -> int:
    """Run a store command; 1 with ``error: ...`` on stderr for a typed error."""
    args = _parser().parse_args(list(argv))
    if getattr(args, "offline", False):
        os.environ["HF_HUB_OFFLINE"] = "1"  # read when huggingface_hub is imported
    try:
        _run(args)
    except LlamapyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
