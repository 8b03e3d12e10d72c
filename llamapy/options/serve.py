"""How the HTTP server presents its models and treats requests: :class:`ServeOptions`.

The serving options that ``create_app`` takes and a served model
(:class:`~llamapy.openai_api.ServedModel`) keeps, defined once here with their default and
help: the app's keyword defaults, the served model's field defaults and the defaults and help
of their ``python -m llamapy.serve`` flags all read this class (:func:`serve_default`,
:func:`serve_help`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llamapy.options._spec import (
    check,
    check_typed_fields,
    default_of,
    field_help,
    option,
    option_names,
)
from llamapy.options.aliases import REASONING_FORMATS
from llamapy.options.reports import CACHE_REPORTS, REPORT_BLOCK
from llamapy.options.timeouts import TIMEOUTS

__all__ = ["SERVE_OPTION_NAMES", "ServeOptions", "serve_default", "serve_help"]


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

    def __post_init__(self) -> None:
        check_typed_fields(self)
        check(self.reasoning_format in REASONING_FORMATS, "reasoning_format",
              f"must be one of {', '.join(REASONING_FORMATS)}")
        check(self.cache_report in CACHE_REPORTS, "cache_report",
              f"must be one of {', '.join(CACHE_REPORTS)}")
        check(self.request_timeout > 0, "request_timeout", "must be > 0 seconds")


#: The names of the serving options.
SERVE_OPTION_NAMES = option_names(ServeOptions)


def serve_default(name: str) -> object:
    """The default of serving option ``name``."""
    return default_of(ServeOptions, name)


def serve_help(name: str) -> str:
    """The help text of serving option ``name``."""
    return field_help(next(f for f in dataclasses.fields(ServeOptions) if f.name == name))
