"""llama-server flags kept apart from the serving group, spelled as llama-server spells them, so
its command lines run unchanged. ``--api-key-file`` and the TLS files are serving options of
the option tree (:class:`~llamapy.options.ServeOptions`: their defaults, help and checks are
there); the others have no option of their own.

- ``--api-key-file FILE``: API keys, one per line, ``KEY [TENANT [admin]]`` (``#`` starts a
  comment line); they join ``--api-key``'s. Tenants: :mod:`llamapy.serve.tenants`.
- ``--ssl-key-file`` / ``--ssl-cert-file``: serve HTTPS (PEM files, both needed).
- ``-lm`` / ``--load-mode``: llama.cpp's model loading mode (``auto``, ``none``, ``mmap``,
  ``mlock``, ``mmap+mlock``, ``dio``), mapped onto ``use_mmap``, ``use_mlock`` and
  ``use_direct_io``; an explicit ``--use-mmap`` / ``--use-mlock`` / ``--use-direct-io`` wins.
- ``--sampler-seq`` / ``--sampling-seq LETTERS``: the sampler order as llama-server's letters
  (``edskypmxt``); ``--samplers a;b;c`` (names) is the ``samplers`` option's own flag.
- ``-cb`` / ``--cont-batching`` is accepted (batching is always continuous here);
  ``-nocb`` / ``--no-cont-batching`` is refused, since it cannot be honoured.
- ``--threads-http N`` is accepted and changes nothing: HTTP runs on one asyncio event loop,
  which never blocks on a request (llama-server's HTTP threads each serve one connection).
- ``--reranking`` / ``--rerank``: serve ``/rerank`` with the model as a reranker (its
  ``--pooling`` is ``rank``; another ``--pooling`` with it is refused).
- ``-bs`` / ``--backend-sampling`` is accepted and changes nothing: llama-server's option to
  sample on the accelerator, whose results are meant to equal CPU sampling's, which is what
  llamapy does (a request's ``backend_sampling`` field is accepted alike).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ...errors import InvalidOptionError, UnsupportedFeatureError
from ..tenants import KeyTable
from .tree import serve_flag

__all__ = ["LOAD_MODES", "add_compat_flags", "api_keys", "check_compat", "compat_start_options",
           "ssl_files"]

#: ``--load-mode`` values and the model options each sets (``auto`` sets none).
LOAD_MODES: dict[str, dict[str, bool]] = {
    "auto": {},
    "none": {"use_mmap": False, "use_mlock": False, "use_direct_io": False},
    "mmap": {"use_mmap": True, "use_mlock": False, "use_direct_io": False},
    "mlock": {"use_mmap": False, "use_mlock": True, "use_direct_io": False},
    "mmap+mlock": {"use_mmap": True, "use_mlock": True, "use_direct_io": False},
    "dio": {"use_direct_io": True},
}


def add_compat_flags(group: argparse._ArgumentGroup) -> None:
    """Add llama-server's flags listed in the module docstring to ``group``."""
    serve_flag(group, "api_key_file", metavar="FILE")
    serve_flag(group, "ssl_key_file", metavar="FILE")
    serve_flag(group, "ssl_cert_file", metavar="FILE")
    group.add_argument("-lm", "--load-mode", choices=tuple(LOAD_MODES), default="auto",
                       help="model loading mode, as llama.cpp's (default: auto = mmap)")
    group.add_argument("--sampler-seq", "--sampling-seq", metavar="LETTERS",
                       help="sampler order as llama-server's letters (default: edskypmxt)")
    group.add_argument("-cb", "--cont-batching", dest="cont_batching", action="store_const",
                       const=True, help="accepted: batching is always continuous here")
    group.add_argument("-nocb", "--no-cont-batching", dest="cont_batching",
                       action="store_const", const=False,
                       help="refused: batching is always continuous here")
    group.add_argument("--threads-http", type=int, metavar="N",
                       help="accepted, changes nothing: HTTP runs on one event loop")
    group.add_argument("--reranking", "--rerank", action="store_true",
                       help="serve /rerank: the model is a reranker (sets --pooling rank)")
    group.add_argument("-bs", "--backend-sampling", "--backend_sampling", action="store_true",
                       help="accepted, changes nothing: sampling runs on the CPU here (the "
                       "results are those backend sampling gives)")


def check_compat(args: argparse.Namespace) -> None:
    """Refuse what cannot be honoured, before the model loads: raises
    :class:`UnsupportedFeatureError`, :class:`~llamapy.errors.InvalidOptionError` (a bad
    ``--api-key-file`` line, named), or ``OSError`` for an unreadable ``--api-key-file``. (Half
    of TLS is refused by the option tree: :func:`llamapy.serve.flags.serving.serve_options`.)"""
    api_keys(args)
    pooling = getattr(args, "pooling_type", None)  # (absent: not given)
    if args.reranking and pooling not in (None, "rank"):
        raise InvalidOptionError(f"--reranking ranks with --pooling rank, not "
                                 f"{pooling}", option="pooling_type")
    if args.cont_batching is False:
        raise UnsupportedFeatureError(
            "cont_batching", "--no-cont-batching: batching is always continuous here")


def api_keys(args: argparse.Namespace) -> KeyTable | None:
    """The keys of ``--api-key`` (comma-separated) and ``--api-key-file`` with their tenants
    (None: no key); :class:`InvalidOptionError` names a bad line of the file."""
    text = ""
    if args.api_key_file:
        text = Path(args.api_key_file).read_text(encoding="utf-8")
    table = KeyTable.parse(text, source=str(args.api_key_file),
                           plain=(args.api_key or "").split(","))
    return table if table.entries else None


def compat_start_options(args: argparse.Namespace, given: dict[str, Any]) -> dict[str, Any]:
    """The start options ``--load-mode``, ``--sampler-seq`` and ``--reranking`` set that were
    not given by their own flags."""
    options: dict[str, Any] = dict(LOAD_MODES[args.load_mode])
    if args.sampler_seq is not None:
        options["samplers"] = args.sampler_seq
    if args.reranking:
        options["pooling_type"] = "rank"
    return {k: v for k, v in options.items() if k not in given}


def ssl_files(args: argparse.Namespace) -> dict[str, str]:
    """uvicorn's ``ssl_keyfile`` / ``ssl_certfile`` (empty: plain HTTP)."""
    if args.ssl_key_file is None:
        return {}
    return {"ssl_keyfile": args.ssl_key_file, "ssl_certfile": args.ssl_cert_file}


