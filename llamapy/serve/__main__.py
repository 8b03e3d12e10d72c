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
from ..options import TIMEOUTS
from ..server import Server
from .flags import DEFAULT_MAX_BODY_BYTES, add_option_flags, serve_start_options

DEFAULT_REQUEST_TIMEOUT = TIMEOUTS.http_request

log = logging.getLogger("llamapy.serve")

LOG_LEVELS = ("debug", "info", "warning", "error")


def build_parser() -> argparse.ArgumentParser:
    """The CLI parser: serving flags, then one group per start-option owner."""
    parser = argparse.ArgumentParser(
        prog="python -m llamapy.serve",
        description="Serve a GGUF model with an OpenAI-compatible API (plus llama-server's "
                    "native endpoints, /metrics and a chat page at /).")
    serve = parser.add_argument_group("serving")
    serve.add_argument("--model", "-m", metavar="PATH",
                       help="GGUF file to serve (default: the default model, fetched if missing)")
    serve.add_argument("--alias", help="public model id (default: the file's stem)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    serve.add_argument("--api-key", help="require 'Authorization: Bearer KEY' or 'x-api-key: KEY' "
                       "(not on /health)")
    serve.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                       help="allow browser requests from ORIGIN (repeatable; '*' for any)")
    serve.add_argument("--chat-template", metavar="FILE_OR_JINJA",
                       help="chat template overriding the GGUF's: a file path or Jinja source")
    serve.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT,
                       metavar="SECONDS", help="per request; per token when streaming "
                       f"(default: {DEFAULT_REQUEST_TIMEOUT:g})")
    serve.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20,
                       help="largest request body accepted, MB (default: %(default)g)")
    serve.add_argument("--no-embeddings-endpoint", action="store_true",
                       help="disable /v1/embeddings (and its dedicated context)")
    serve.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                       help="log level (default: info)")
    add_option_flags(parser)
    return parser


def read_template(value: str | None) -> str | None:
    """``--chat-template``: the file's text when ``value`` names a file, else ``value``."""
    if value is None:
        return None
    path = Path(value)
    try:
        is_file = len(value) < 4096 and path.is_file()
    except OSError:
        is_file = False
    return path.read_text(encoding="utf-8") if is_file else value


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
        app = create_app(server, alias=args.alias, api_key=args.api_key,
                         cors_origins=args.cors_origin,
                         chat_template=read_template(args.chat_template),
                         request_timeout=args.request_timeout,
                         max_body_bytes=int(args.max_body_mb * 2**20),
                         embeddings=not args.no_embeddings_endpoint, own_server=True)
    except (LlamapyError, OSError) as exc:
        server.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    alias = args.alias or path.stem
    log.info("serving %s (%s) at http://%s:%d/", alias, path, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port,
                log_level="debug" if args.log_level == "debug" else "warning",
                access_log=args.log_level == "debug")
    return 0


if __name__ == "__main__":
    sys.exit(main())
