"""``python -m llamapy.serve``: serve a GGUF model over an OpenAI-compatible HTTP API.

With no ``--model`` it serves the default model (fetched into the cache on first run, with
pip's progress bar). Every ``Server`` start option is a flag (see ``--help``). The server binds
127.0.0.1:8080 by default and logs one line with the URL and the model when it starts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import LlamapyError
from ..server import Server
from .flags import add_option_flags, serve_start_options
from .serving_flags import LOG_LEVELS, add_serving_flags, app_options, read_template

__all__ = ["LOG_LEVELS", "build_parser", "main", "model_path", "read_template"]

log = logging.getLogger("llamapy.serve")


def build_parser() -> argparse.ArgumentParser:
    """The CLI parser: serving flags, then one group per start-option owner."""
    parser = argparse.ArgumentParser(
        prog="python -m llamapy.serve",
        description="Serve a GGUF model with an OpenAI-compatible API (plus llama-server's "
                    "native endpoints, /metrics and a chat page at /). llama-server's flag "
                    "spellings are accepted (-m, -c, -np, -ngl, -fa, --alias, ...).")
    add_serving_flags(parser.add_argument_group("serving"))
    add_option_flags(parser)
    return parser


def model_path(value: str | None) -> Path:
    """``--model``, or the default model (fetched when missing)."""
    if value:
        return Path(value)
    from ..models import default_model_path

    return default_model_path(fetch=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until interrupted."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        path = model_path(args.model)
        server = Server(path, **serve_start_options(args))  # loads on its thread from now on
    except (LlamapyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn  # the HTTP stack imports while the model loads

    from .app import create_app

    try:
        options = app_options(args)
        app = create_app(server, own_server=True, **options)
    except (LlamapyError, OSError) as exc:
        server.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    alias = options["alias"] or path.stem
    log.info("serving %s (%s) at http://%s:%d/", alias, path, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port,
                log_level="debug" if args.log_level == "debug" else "warning",
                access_log=args.log_level == "debug")
    return 0


if __name__ == "__main__":
    sys.exit(main())
