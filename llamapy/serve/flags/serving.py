"""The serving flags of ``python -m llamapy.serve`` (the start options' flags are in
:mod:`llamapy.serve.flags.start`), spelled as llama-server spells them where it has them.

llama-server's names that change nothing here are accepted so its command lines run
unchanged: ``--jinja`` / ``--no-jinja`` (templates are always Jinja), ``--embedding`` /
``--embeddings`` (embeddings are always served; ``--no-embeddings-endpoint`` turns them off).
``--metrics`` is accepted and ``/metrics`` is on unless ``--no-metrics`` (llama-server's
default is off).

A flag of a serving option (:class:`~llamapy.options.ServeOptions`) takes its default and help
from the option tree (:mod:`llamapy.serve.flags.tree`). :func:`serve_options` turns the parsed
flags into the tree's options, checked there; :func:`app_options` into ``create_app`` keywords.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from ...chat.builtin_templates import BUILTIN_TEMPLATES, LLAMA_CPP_NAMES
from ...errors import InvalidOptionError, UnsupportedFeatureError
from ...options import REASONING_FORMATS
from ...options.reports import CACHE_REPORTS
from ...options.serve import (
    LOG_LEVELS,
    REASONING_SWITCHES,
    SERVE_OPTION_NAMES,
    ServeOptions,
    serve_default,
    serve_help,
)
from .compat import api_keys
from .tree import serve_flag, serve_switch, switch

__all__ = ["LOG_LEVELS", "NOT_APP_OPTIONS", "add_serving_flags", "app_options", "bind_hosts",
           "body_bytes", "read_template", "serve_options", "sleep_idle_seconds",
           "template_kwargs", "url_prefix"]

#: The serving options' defaults (the option tree's).
_TREE = ServeOptions()
DEFAULT_REQUEST_TIMEOUT = _TREE.request_timeout
#: ``--reasoning`` values (llama-server's) and the template variables they set.
REASONING_SWITCH: dict[str, dict[str, bool]] = {
    "on": {"enable_thinking": True}, "off": {"enable_thinking": False}, "auto": {}}
#: ``--max-body-mb``'s unit, in bytes.
MB = 1024 * 1024
#: Serving options that are no ``create_app`` keyword: uvicorn's (bind address, TLS), the
#: log's, and those it takes in another form (the API keys as a table, ``reasoning`` as
#: template variables).
NOT_APP_OPTIONS = frozenset({
    "host", "port", "ssl_key_file", "ssl_cert_file", "api_key", "api_key_file", "reasoning",
    "log_level", "log_colors", "log_timestamps", "log_prefix", "log_file", "log_disable"})


class _ListAppend(argparse.Action):
    """A repeatable flag whose values may also be comma-separated (llama-server's lists)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        items = list(getattr(namespace, self.dest, None) or [])
        items.extend(v.strip() for v in str(values).split(",") if v.strip())
        setattr(namespace, self.dest, items)


def _add_identity(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--model", "-m", metavar="PATH", action="append",
                       help="GGUF file to serve (default: the default model, fetched if "
                            "missing); repeatable: several models, loaded on demand")
    serve_flag(group, "alias", "-a", "--alias", action=_ListAppend, metavar="NAME",
               more="; repeatable or comma-separated: as llama-server, the alphabetically "
                    "first is the id, all are accepted; with several --model, one per model, "
                    "in order")
    serve_flag(group, "accept_any_model", action="store_true")
    serve_flag(group, "tags", action=_ListAppend, metavar="TAG")
    serve_flag(group, "host")
    serve_flag(group, "port", type=int)
    serve_flag(group, "api_key")
    serve_flag(group, "cors_origins", action=_ListAppend, metavar="ORIGIN")
    serve_flag(group, "allowed_hosts", action=_ListAppend, metavar="NAME")


def _add_requests(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--chat-template", metavar="NAME_FILE_OR_JINJA",
                       help="chat template overriding the GGUF's: a built-in name ("
                            + ", ".join(BUILTIN_TEMPLATES) + "), a file path or Jinja source")
    group.add_argument("--chat-template-file", metavar="FILE",
                       help="chat template file overriding the GGUF's (wins over "
                            "--chat-template)")
    serve_flag(group, "n_predict", type=int, metavar="N")
    serve_flag(group, "default_ignore_eos", "--ignore-eos", action="store_true")
    serve_flag(group, "reasoning_format", choices=REASONING_FORMATS)
    serve_flag(group, "cache_report", choices=CACHE_REPORTS)
    group.add_argument("--chat-template-kwargs", metavar="JSON",
                       help="chat template variables of every request, a JSON object "
                            "(a request's chat_template_kwargs extend them)")
    serve_flag(group, "reasoning", "-rea", "--reasoning", choices=REASONING_SWITCHES)
    serve_flag(group, "request_timeout", type=float, metavar="SECONDS")
    serve_flag(group, "media_path", metavar="DIR")
    serve_flag(group, "media_remote", action="store_true")
    serve_flag(group, "media_remote_private", action="store_true")
    # the option is in bytes, the flag in MB (llama-server has no such flag)
    group.add_argument("--max-body-mb", type=float,
                       default=_TREE.max_body_bytes / MB,
                       help=serve_help("max_body_bytes") + ", MB (default: %(default)g)")


def _add_http(group: argparse._ArgumentGroup) -> None:
    serve_flag(group, "api_prefix", metavar="PREFIX")
    serve_flag(group, "sse_ping_interval", type=float, metavar="S")


def _add_endpoints(group: argparse._ArgumentGroup) -> None:
    # (its own dest: ``embeddings`` is also a start option, the context's embeddings mode)
    group.add_argument("--no-embeddings-endpoint", dest="embeddings_endpoint",
                       action="store_false",
                       help="disable /v1/embeddings (and its dedicated context)")
    group.set_defaults(embeddings_endpoint=serve_default("embeddings"))
    group.add_argument("--embedding", "--embeddings", dest="embedding", action="store_true",
                       help="accepted for llama-server compatibility: embeddings are always "
                            "served next to generation")
    serve_switch(group, "webui", ("--no-webui", "--no-ui"),
                 "no pages: / and /dashboard answer 404")
    serve_switch(group, "slots", ("--no-slots",), "/slots answers 501")
    serve_switch(group, "prefill_assistant", ("--no-prefill-assistant",),
                 "answer a final assistant message in a new turn instead of continuing it")
    serve_flag(group, "spm_infill", action="store_true")
    serve_flag(group, "slot_save_path", metavar="DIR")
    serve_flag(group, "slot_save_max_mb", type=float, metavar="MB")
    serve_flag(group, "slot_save_max_files", type=int, metavar="N")
    serve_flag(group, "slot_save_tenant_max_mb", type=float, metavar="MB")
    serve_flag(group, "slot_save_tenant_max_files", type=int, metavar="N")
    serve_flag(group, "responses_store", metavar="FILE")
    serve_flag(group, "responses_ttl", type=float, metavar="SECONDS")
    serve_flag(group, "responses_max_mb", type=float, metavar="MB")
    serve_flag(group, "responses_tenant_max_mb", type=float, metavar="MB")
    serve_flag(group, "props", action="store_true")
    serve_switch(group, "metrics", ("--no-metrics",), "/metrics answers 501")
    switch(group, ("--jinja",), "jinja", True,
           "accepted for llama-server compatibility: templates are always rendered as Jinja")
    switch(group, ("--no-jinja",), "jinja", False,
           "accepted for llama-server compatibility; ignored (templates are always Jinja)")
    serve_flag(group, "log_level", choices=LOG_LEVELS)
    group.add_argument("-v", "--verbose", "--log-verbose", dest="log_level",
                       action="store_const", const="debug", help="same as --log-level debug")


def _add_lifecycle(group: argparse._ArgumentGroup) -> None:
    serve_flag(group, "sleep_idle_seconds", type=float, metavar="SECONDS")


def add_serving_flags(group: argparse._ArgumentGroup) -> None:
    """Add the serving flags to ``group``."""
    _add_identity(group)
    _add_requests(group)
    _add_http(group)
    _add_endpoints(group)
    _add_lifecycle(group)


def read_template(value: str | None) -> str | None:
    """``--chat-template``: a built-in's source, the file's text when ``value`` names a file,
    else ``value`` (Jinja source); a llama.cpp built-in name we have no Jinja for raises
    :class:`UnsupportedFeatureError`."""
    if value is None:
        return None
    if value in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[value]
    if value in LLAMA_CPP_NAMES:
        raise UnsupportedFeatureError(
            "chat_template", f"llama.cpp's built-in chat template {value!r} has no Jinja "
            f"version here (built in: {', '.join(BUILTIN_TEMPLATES)}); pass the model's "
            "template with --chat-template-file")
    path = Path(value)
    try:
        is_file = len(value) < 4096 and path.is_file()
    except OSError:
        is_file = False
    return path.read_text(encoding="utf-8") if is_file else value


def template_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The server-wide chat template variables: ``--chat-template-kwargs`` (a JSON object),
    then what ``--reasoning on|off`` sets. A value that is not a JSON object raises
    :class:`InvalidOptionError`."""
    text = getattr(args, "chat_template_kwargs", None)
    try:
        kwargs = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise InvalidOptionError(f"--chat-template-kwargs is not JSON: {exc}",
                                 option="chat_template_kwargs") from None
    if not isinstance(kwargs, dict):
        raise InvalidOptionError("--chat-template-kwargs must be a JSON object",
                                 option="chat_template_kwargs")
    return {**kwargs, **REASONING_SWITCH[args.reasoning]}


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """The serving options the parsed flags give, checked by the option tree (a bad value
    raises :class:`InvalidOptionError`, before any model loads when called first)."""
    names = sorted(set(args.alias or ())) or [None]  # llama-server keeps them in a std::set
    values = {name: getattr(args, name) for name in SERVE_OPTION_NAMES if hasattr(args, name)}
    values.update(alias=names[0], aliases=tuple(names[1:]), tags=tuple(sorted(set(args.tags))),
                  cors_origins=tuple(args.cors_origins), allowed_hosts=tuple(args.allowed_hosts),
                  embeddings=args.embeddings_endpoint, max_body_bytes=body_bytes(args.max_body_mb),
                  sleep_idle_seconds=sleep_idle_seconds(args))
    return ServeOptions(**values)


def app_options(args: argparse.Namespace) -> dict[str, Any]:
    """``create_app`` keywords (beyond the target and ``own_server``) from the flags: the
    serving options (:func:`serve_options`) but :data:`NOT_APP_OPTIONS`, the API keys' table,
    the chat template and its variables, the bound addresses and ``verbose``."""
    serving = serve_options(args)
    template = (Path(args.chat_template_file).read_text(encoding="utf-8")
                if args.chat_template_file else read_template(args.chat_template))
    return {**{name: getattr(serving, name) for name in SERVE_OPTION_NAMES
               if name not in NOT_APP_OPTIONS},
            "api_keys": api_keys(args), "chat_template": template,
            "template_kwargs": template_kwargs(args), "bind_hosts": bind_hosts(args),
            "verbose": serving.log_level == "debug"}


def body_bytes(mb: float) -> int:
    """``--max-body-mb`` in bytes (a value that is no finite number raises
    :class:`InvalidOptionError`; the option tree checks the rest)."""
    if not math.isfinite(mb):
        raise InvalidOptionError(f"--max-body-mb must be a finite number, got {mb!r}",
                                 option="max_body_bytes")
    return int(mb * MB)


def bind_hosts(args: argparse.Namespace) -> tuple[str, ...]:
    """The addresses ``--host`` names (comma-separated; none: ``127.0.0.1``)."""
    return tuple(h.strip() for h in args.host.split(",") if h.strip()) or ("127.0.0.1",)


def url_prefix(value: str) -> str:
    """``--api-prefix`` normalised: ``""`` for none, else ``/a/b`` (a leading slash added, a
    trailing one dropped, as llama-server takes it); ``InvalidOptionError`` if it is no path."""
    prefix = "/" + value.strip("/") if value.strip("/") else ""
    if any(c in prefix for c in "?#% ") or "//" in prefix:
        raise InvalidOptionError(f"api_prefix {value!r} is not a URL path", option="api_prefix")
    return prefix


def sleep_idle_seconds(args: argparse.Namespace) -> float | None:
    """``--sleep-idle-seconds`` (None: never sleep, as when it is negative)."""
    value = args.sleep_idle_seconds
    return None if value is None or value < 0 else float(value)
