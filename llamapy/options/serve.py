"""How the HTTP server presents its models and treats requests: :class:`ServeOptions`.

The serving options of ``python -m llamapy.serve`` and ``create_app``, defined once here with
their default and help: what a served model (:class:`~llamapy.openai_api.ServedModel`) keeps,
who may call the server (API keys, browser origins, ``Host`` names), the request body limit,
idle sleep, and the process's own (bind address, TLS, logging). The app's keyword defaults, the
served model's field defaults and the defaults and help of the ``python -m llamapy.serve``
flags all read this class (:func:`serve_default`, :func:`serve_help`), and its checks run where
a value comes in (the parsed flags, ``create_app``'s keywords, a served model's fields).

One unit per option: ``max_body_bytes`` is in bytes; its flag, ``--max-body-mb``, takes MB.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llamapy.options._spec import (
    check,
    check_typed_fields,
    default_of,
    field_help,
    is_finite,
    option,
    option_names,
)
from llamapy.options.aliases import REASONING_FORMATS
from llamapy.options.reports import CACHE_REPORTS, REPORT_BLOCK
from llamapy.options.timeouts import TIMEOUTS

__all__ = ["LOG_COLORS", "LOG_LEVELS", "REASONING_SWITCHES", "SERVE_OPTION_NAMES",
           "SLOT_BUDGETS", "ServeOptions", "serve_default", "serve_help"]

#: ``log_level`` values (Python's logging levels, lower case).
LOG_LEVELS = ("debug", "info", "warning", "error")
#: ``log_colors`` values.
LOG_COLORS = ("on", "off", "auto")
#: ``reasoning`` values (llama-server's ``--reasoning``).
REASONING_SWITCHES = ("on", "off", "auto")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeOptions:
    """The serving options (see the module docstring; each field's help says what it does)."""

    n_predict: int = option(-1, "tokens to generate when a request sets no limit (-1 = the "
                            "rest of the context)", flags=("-n", "--predict"))
    reasoning_format: str = option(
        "auto", "reasoning_format of requests that set none: auto/deepseek separate "
        "reasoning_content, none leaves it in the text")
    cache_report: str = option(
        "exact", "what responses say about prefix reuse (cached tokens, cache_n, "
        "X-Llamapy-Cache-* headers): exact; coarse = rounded down to "
        f"{REPORT_BLOCK} tokens, as OpenAI reports them, for tenants not trusted with each "
        "other's prompts inside one scope; off = nothing reused")
    default_ignore_eos: bool = option(
        False, "requests that set no ignore_eos generate past end-of-generation tokens "
        "(llama-server's --ignore-eos)")
    prefill_assistant: bool = option(True, "continue a final assistant message")
    spm_infill: bool = option(False, "/infill: suffix/prefix/middle order (for models that "
                              "want it)")
    accept_any_model: bool = option(
        False, "answer requests naming any model (llama-server does; by default an unknown "
        "model is a 404, as in vLLM)")
    request_timeout: float = option(
        TIMEOUTS.http_request, "seconds per request; per token when streaming "
        "(llama-server's -to: its read/write timeout)", flags=("-to", "--timeout"))
    sse_ping_interval: float = option(
        30.0, "send a keep-alive comment on a stream silent for this many seconds (<= 0: "
        "never; 30 as llama-server)")
    api_prefix: str = option("", "serve every route (the pages and /health too) under this "
                             "path, e.g. /llm (llama-server's; default: none)")
    host: str = option("127.0.0.1", "bind address; several comma-separated (127.0.0.1,::1)")
    port: int = option(8080, "port")
    embeddings: bool = option(True, "serve /v1/embeddings (and its dedicated context)")
    webui: bool = option(True, "serve the chat page at / and the live view at /dashboard",
                         flags=("--ui",))
    slots: bool = option(True, "serve /slots")
    metrics: bool = option(True, "serve Prometheus /metrics (on by default here, unlike "
                           "llama-server)")
    props: bool = option(False, "accept POST /props (llama-server's; it changes nothing yet, "
                         "there or here); GET /props is always served")
    slot_save_path: str | None = option(
        None, "folder for POST /slots/{id}?action=save|restore (default: off, those actions "
        "answer 501)")
    slot_save_max_mb: float = option(
        16384, "most MB of slot files in --slot-save-path, every tenant's together, counted "
        "from the folder at start; a save past it is a 403 (0 = no bound)")
    slot_save_max_files: int = option(
        1024, "most slot files in --slot-save-path, every tenant's together (0 = no bound)")
    slot_save_tenant_max_mb: float = option(
        4096, "most MB of one tenant's slot files (0 = no bound)")
    slot_save_tenant_max_files: int = option(
        128, "most slot files of one tenant (0 = no bound)")
    responses_store: str = option(
        "auto", "SQLite file keeping stored Responses (store: true, previous_response_id, "
        "GET/DELETE /v1/responses/{id}) and /v1/conversations, per tenant ('auto': "
        "responses.sqlite3 in the cache folder $LLAMAPY_CACHE; ':memory:' until exit; 'off': "
        "nothing is stored and those fields are refused)")
    responses_ttl: float = option(
        30 * 86400, "seconds a stored response or conversation is kept after its creation "
        "(0 = until evicted by --responses-max-mb; default: 30 days, as OpenAI)")
    responses_max_mb: float = option(
        1024, "most MB of stored responses and conversation items, every tenant's together; "
        "past it the least recently used go first (0 = no bound)")
    responses_tenant_max_mb: float = option(
        256, "most MB of one tenant's stored responses and conversation items; past it that "
        "tenant's least recently used go first (0 = no bound)")
    alias: str | None = option(None, "public model id (default: the file's stem)",
                               flags=("-a",))
    aliases: tuple[str, ...] = option(
        (), "more model ids requests may name (-a/--alias given several names: all but the "
        "alphabetically first)")
    tags: tuple[str, ...] = option((), "informational model tags, comma-separated (shown in "
                                   "/v1/models)")
    api_key: str | None = option(
        None, "require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (not on /health); "
        "several keys comma-separated")
    api_key_file: str | None = option(
        None, "API keys, one per line: KEY [TENANT [admin]] ('#' lines are comments); with "
        "--api-key")
    cors_origins: tuple[str, ...] = option(
        (), "allow browser pages from these origins to read responses (repeatable or "
        "comma-separated; '*' for any, 'localhost' for any local origin: the default); other "
        "pages may not send POST requests", flags=("--cors-origin",))
    allowed_hosts: tuple[str, ...] = option(
        (), "Host names this server answers to besides localhost, IP addresses and --host "
        "names (repeatable or comma-separated; '.example.com' for a domain and its "
        "subdomains, '*' for any): other names are refused, which stops DNS-rebinding pages "
        "(default: none; on --host 0.0.0.0 or :: without this flag, any name is answered)")
    # 16 MiB: generous for long prompts, small enough to stop abuse
    max_body_bytes: int = option(16 * 1024 * 1024, "largest request body accepted")
    media_path: str | None = option(
        None, "folder whose files requests may name as file:// image URLs, by a relative path "
        "(default: none)")
    media_remote: bool = option(
        False, "fetch the http(s) image URLs requests name, on public addresses (within "
        "--max-media-bytes and 10 s; default: off, the server fetches nothing a request "
        "names)")
    media_remote_private: bool = option(
        False, "with --media-remote, also fetch from loopback, private and link-local "
        "addresses (default: off: a URL must not reach inside the server's network)")
    reasoning: str = option(
        "auto", "thinking in the chat template: on/off set enable_thinking for requests that "
        "do not (default: auto = the template's own)", flags=("-rea",))
    sleep_idle_seconds: float | None = option(
        None, "unload the model after this many seconds without a request and reload it on "
        "the next one (/props is_sleeping; default: never, as any negative value such as "
        "llama-server's -1; with several models: the default --keep-alive)")
    ssl_key_file: str | None = option(None, "PEM private key: serve HTTPS")
    ssl_cert_file: str | None = option(None, "PEM certificate: serve HTTPS")
    log_level: str = option("info", "log level")
    log_colors: str = option("auto", "colour the log by level (default: auto, when stderr is "
                             "a terminal)")
    log_timestamps: bool = option(True, "the time before each message")
    log_prefix: bool = option(True, "the level and logger name before each message")
    log_file: str | None = option(None, "also write the log to FILE")
    log_disable: bool = option(False, "log nothing")

    def __post_init__(self) -> None:
        check_typed_fields(self)
        for name, allowed in _CHOICES.items():
            check(getattr(self, name) in allowed, name, f"must be one of {', '.join(allowed)}")
        check(self.request_timeout > 0, "request_timeout", "must be > 0 seconds")
        check(self.max_body_bytes > 0, "max_body_bytes", "must be > 0 bytes")
        for name in (*SLOT_BUDGETS, "responses_ttl", "responses_max_mb",
                     "responses_tenant_max_mb"):
            check(is_finite(getattr(self, name)) and getattr(self, name) >= 0, name,
                  "must be a number >= 0 (0 = no bound)")
        check(self.responses_store != "", "responses_store", "must be a file, 'auto', "
              "':memory:' or 'off'")
        check(self.sleep_idle_seconds is None or is_finite(self.sleep_idle_seconds),
              "sleep_idle_seconds", f"expected None or a finite number of seconds, got "
              f"{self.sleep_idle_seconds!r}")
        check((self.ssl_key_file is None) == (self.ssl_cert_file is None), "ssl_key_file",
              "HTTPS needs both --ssl-key-file and --ssl-cert-file")
        _check_texts(self)


#: The slot-file budgets (:mod:`llamapy.serve.slot_store`).
SLOT_BUDGETS = ("slot_save_max_mb", "slot_save_max_files", "slot_save_tenant_max_mb",
                "slot_save_tenant_max_files")
#: The options with a fixed set of values, and those values.
_CHOICES: dict[str, tuple[str, ...]] = {
    "reasoning_format": REASONING_FORMATS, "cache_report": CACHE_REPORTS,
    "reasoning": REASONING_SWITCHES, "log_level": LOG_LEVELS, "log_colors": LOG_COLORS}
#: The options that are a string or None, and those that are a list (or tuple) of strings.
_TEXTS = ("alias", "api_key", "api_key_file", "ssl_key_file", "ssl_cert_file", "log_file",
          "media_path")
_TEXT_LISTS = ("aliases", "tags", "cors_origins", "allowed_hosts")


def _check_texts(options: ServeOptions) -> None:
    """Refuse a text option that is no string and a list option that is no list of strings."""
    for name in _TEXTS:
        value = getattr(options, name)
        check(value is None or isinstance(value, str), name,
              f"expected a string or None, got {value!r}")
    for name in _TEXT_LISTS:
        value = getattr(options, name)
        check(isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value),
              name, f"expected a list of strings, got {value!r}")


#: The names of the serving options.
SERVE_OPTION_NAMES = option_names(ServeOptions)


def serve_default(name: str) -> object:
    """The default of serving option ``name``."""
    return default_of(ServeOptions, name)


def serve_help(name: str) -> str:
    """The help text of serving option ``name``."""
    return field_help(next(f for f in dataclasses.fields(ServeOptions) if f.name == name))
