"""The serving flags of ``python -m llamapy.serve`` (the start options' flags are in
:mod:`llamapy.serve.flags.start`), spelled as llama-server spells them where it has them.

llama-server's names that change nothing here are accepted so its command lines run
unchanged: ``--jinja`` / ``--no-jinja`` (templates are always Jinja), ``--embedding`` /
``--embeddings`` (embeddings are always served; ``--no-embeddings-endpoint`` turns them off).
``--metrics`` is accepted and ``/metrics`` is on unless ``--no-metrics`` (llama-server's
default is off). :func:`app_options` turns the parsed flags into ``create_app`` keywords.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ...chat.builtin_templates import BUILTIN_TEMPLATES, LLAMA_CPP_NAMES
from ...errors import InvalidOptionError, UnsupportedFeatureError
from ...options import REASONING_FORMATS
from ...options.reports import CACHE_REPORTS
from ...options.serve import ServeOptions, serve_default
from .compat import api_keys
from .start import DEFAULT_MAX_BODY_BYTES
from .tree import serve_flag, serve_switch, switch

__all__ = ["LOG_LEVELS", "add_serving_flags", "app_options", "bind_hosts", "read_template",
           "sleep_idle_seconds", "template_kwargs", "url_prefix"]

LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_REQUEST_TIMEOUT = ServeOptions().request_timeout
#: ``--reasoning`` values (llama-server's) and the template variables they set.
REASONING_SWITCH = {"on": {"enable_thinking": True}, "off": {"enable_thinking": False},
                    "auto": {}}


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
    group.add_argument("-a", "--alias", action=_ListAppend, default=[], metavar="NAME",
                       help="public model id (default: the file's stem); repeatable or "
                            "comma-separated: as llama-server, the alphabetically first is "
                            "the id, all are accepted; with several --model, one per model, "
                            "in order")
    serve_flag(group, "accept_any_model", action="store_true")
    group.add_argument("--tags", action=_ListAppend, default=[], metavar="TAG",
                       help="informational model tags, comma-separated (shown in /v1/models)")
    serve_flag(group, "host")
    serve_flag(group, "port", type=int)
    group.add_argument("--api-key", help="require 'Authorization: Bearer KEY' or "
                       "'x-api-key: KEY' (not on /health)")
    group.add_argument("--cors-origin", "--cors-origins", dest="cors_origin", action=_ListAppend,
                       default=[], metavar="ORIGIN", help="allow browser pages from ORIGIN "
                       "to read responses (repeatable or comma-separated; '*' for any, "
                       "'localhost' for any local origin: the default); other pages may "
                       "not send POST requests")
    group.add_argument("--allowed-hosts", action=_ListAppend, default=[], metavar="NAME",
                       help="Host names this server answers to besides localhost, IP addresses "
                       "and --host names (repeatable or comma-separated; '.example.com' for a "
                       "domain and its subdomains, '*' for any): other names are refused, "
                       "which stops DNS-rebinding pages (default: none; on --host 0.0.0.0 or "
                       ":: without this flag, any name is answered)")


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
    group.add_argument("-rea", "--reasoning", choices=tuple(REASONING_SWITCH), default="auto",
                       help="thinking in the chat template: on/off set enable_thinking for "
                            "requests that do not (default: auto = the template's own)")
    serve_flag(group, "request_timeout", type=float, metavar="SECONDS")
    group.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20,
                       help="largest request body accepted, MB (default: %(default)g)")


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
    serve_flag(group, "props", action="store_true")
    serve_switch(group, "metrics", ("--no-metrics",), "/metrics answers 501")
    switch(group, ("--jinja",), "jinja", True,
           "accepted for llama-server compatibility: templates are always rendered as Jinja")
    switch(group, ("--no-jinja",), "jinja", False,
           "accepted for llama-server compatibility; ignored (templates are always Jinja)")
    group.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                       help="log level (default: info)")
    group.add_argument("-v", "--verbose", "--log-verbose", dest="log_level",
                       action="store_const", const="debug", help="same as --log-level debug")


def _add_lifecycle(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--sleep-idle-seconds", type=float, default=-1, metavar="SECONDS",
                       help="unload the model after SECONDS without a request and reload it "
                            "on the next one (/props is_sleeping; default: -1 = never; with "
                            "several models: the default --keep-alive)")


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


def app_options(args: argparse.Namespace) -> dict[str, Any]:
    """``create_app`` keywords (beyond the target and ``own_server``) from the flags."""
    template = (Path(args.chat_template_file).read_text(encoding="utf-8")
                if args.chat_template_file else read_template(args.chat_template))
    names = sorted(set(args.alias)) or [None]  # llama-server keeps them in a std::set
    return {
        "alias": names[0], "aliases": tuple(names[1:]), "tags": tuple(sorted(set(args.tags))),
        "api_prefix": args.api_prefix, "sse_ping_interval": args.sse_ping_interval,
        "api_keys": api_keys(args), "cors_origins": args.cors_origin, "chat_template": template,
        "allowed_hosts": tuple(args.allowed_hosts), "bind_hosts": bind_hosts(args),
        "request_timeout": args.request_timeout, "max_body_bytes": int(args.max_body_mb * 2**20),
        "embeddings": args.embeddings_endpoint, "webui": args.webui, "slots": args.slots,
        "metrics": args.metrics, "props": args.props,
        "slot_save_path": args.slot_save_path,
        "n_predict": args.n_predict, "reasoning_format": args.reasoning_format,
        "template_kwargs": template_kwargs(args), "accept_any_model": args.accept_any_model,
        "prefill_assistant": args.prefill_assistant,
        "spm_infill": args.spm_infill, "verbose": args.log_level == "debug",
        "default_ignore_eos": args.default_ignore_eos,
        "cache_report": args.cache_report,
        "sleep_idle_seconds": sleep_idle_seconds(args),
    }


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
    """``--sleep-idle-seconds`` (None: never sleep)."""
    value = float(args.sleep_idle_seconds)
    return value if value >= 0 else None
