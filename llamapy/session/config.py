"""Session inputs, configs and reports: frozen, slotted, keyword-only dataclasses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llamapy.chat.delta import ToolCall
from llamapy.engine.request import RequestTimings
from llamapy.errors import InvalidOptionError, UnsupportedFeatureError
from llamapy.session.manifest import ContextManifest

__all__ = [
    "AdapterSpec",
    "ContextReport",
    "DecodeConfig",
    "PrefixInput",
    "PrefixSegment",
    "PrefixStatus",
    "SessionConfig",
    "StreamChunk",
    "StructuredOutput",
    "SuffixInput",
    "SuffixStatus",
]

REASONING_FORMATS = ("auto", "none")
STRUCTURED_KINDS = ("none", "json_schema", "json_schema_tool_calls", "grammar")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterSpec:
    """One LoRA adapter: its digest and scale are part of the manifest identity."""

    path: str
    scale: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """How a session is opened.

    ``cache_scope``: the scope its KV is filed under (reuse never crosses scopes).
    ``lease_timeout``: seconds to wait for a free slot before ``LeaseTimeoutError``.
    ``request_timeout``: seconds to wait for each engine event (prefill or token).
    ``n_ctx`` / ``n_batch`` / ``context_options``: standalone sessions only (own context).
    """

    cache_scope: str | None = None
    adapters: tuple[AdapterSpec, ...] = ()
    lease_timeout: float = 30.0
    request_timeout: float = 120.0
    n_ctx: int = 4096
    n_batch: int = 512
    context_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.lease_timeout < 0 or self.request_timeout <= 0:
            raise InvalidOptionError("timeouts must be positive", option="lease_timeout")
        if self.n_ctx < 1 or self.n_batch < 1:
            raise InvalidOptionError("n_ctx and n_batch must be >= 1", option="n_ctx")
        object.__setattr__(self, "adapters", tuple(self.adapters))


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixSegment:
    """A named part of a stable prefix (``kind``: ``"instructions"``, ``"repo_map"``, ...)."""

    kind: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixInput:
    """The stable prefix: exactly one of ``text``, ``segments`` or ``token_ids``.

    Segments are tokenized one by one (BOS only before the first) and concatenated, so each
    segment's token range is exact. ``add_bos`` (None: the model's default) is the BOS policy.
    ``manifest`` (optional) declares the identity the caller expects: fields the session can
    verify (model, tokenizer, runtime, adapters) must match it, or ``ManifestMismatchError``;
    the caller's fields (chat template digest, BOS policy) become part of the identity.
    """

    text: str | None = None
    segments: tuple[PrefixSegment, ...] = ()
    token_ids: tuple[int, ...] | None = None
    add_bos: bool | None = None
    manifest: ContextManifest | None = None

    def __post_init__(self) -> None:
        given = sum([self.text is not None, bool(self.segments), self.token_ids is not None])
        if given != 1:
            raise InvalidOptionError("PrefixInput needs exactly one of text, segments, token_ids",
                                     option="text")
        object.__setattr__(self, "segments", tuple(self.segments))
        if self.token_ids is not None:
            object.__setattr__(self, "token_ids", tuple(self.token_ids))


@dataclass(frozen=True, slots=True, kw_only=True)
class SuffixInput:
    """The volatile tail (a diff, test output, the user's turn): ``text`` or ``token_ids``
    (no BOS is added). ``manifest``, if given, must have the resident identity."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    manifest: ContextManifest | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.token_ids is None):
            raise InvalidOptionError("SuffixInput needs exactly one of text, token_ids",
                                     option="text")
        if self.token_ids is not None:
            object.__setattr__(self, "token_ids", tuple(self.token_ids))


@dataclass(frozen=True, slots=True, kw_only=True)
class StructuredOutput:
    """Constrained output: ``kind="json_schema"`` constrains to ``schema``;
    ``"json_schema_tool_calls"`` also parses the JSON (``{"name", "arguments"}`` or a list of
    them) into tool calls; ``"grammar"`` constrains to the GBNF text ``grammar`` (root rule
    ``root``), as llama-server's ``grammar`` field does."""

    kind: str = "none"
    schema: Mapping[str, Any] | bool | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise UnsupportedFeatureError(f"structured_output:{self.kind}")
        if self.kind == "grammar":
            if not self.grammar or self.schema is not None:
                raise InvalidOptionError("structured_output grammar needs grammar (and no "
                                         "schema)", option="structured_output")
        elif self.grammar is not None:
            raise InvalidOptionError(f"structured_output {self.kind} takes no grammar",
                                     option="structured_output")
        elif self.kind != "none" and self.schema is None:
            raise InvalidOptionError(f"structured_output {self.kind} needs a schema",
                                     option="structured_output")


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeConfig:
    """One decode pass. ``max_tokens=None`` decodes until EOG or the context is full; unset
    sampling fields take the server's defaults. ``parser_protocols``: e.g. ``("think",
    "hermes")``; when the resident text ends with the reasoning start marker (a suffix that
    opens ``<think>``), the output is parsed as starting inside reasoning.
    ``reasoning_format``: ``"auto"`` (reasoning goes to ``thinking``) or ``"none"`` (left in
    ``text``)."""

    max_tokens: int | None = 256
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    parser_protocols: tuple[str, ...] = ()
    reasoning_format: str = "auto"
    structured_output: StructuredOutput = field(default_factory=StructuredOutput)

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidOptionError("max_tokens must be >= 1 (or None)", option="max_tokens")
        if self.reasoning_format not in REASONING_FORMATS:
            raise UnsupportedFeatureError(f"reasoning_format:{self.reasoning_format}")
        object.__setattr__(self, "parser_protocols", tuple(self.parser_protocols))


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixStatus:
    """What ``ensure_prefix`` reused versus computed: ``reused_tokens > 0`` is a warm hit."""

    prefix_tokens: int
    reused_tokens: int
    prefilled_tokens: int
    dropped_tokens: int
    cold: bool
    timings: RequestTimings


@dataclass(frozen=True, slots=True, kw_only=True)
class SuffixStatus:
    """What ``prefill_suffix`` computed (``reused_tokens`` counts suffix tokens only)."""

    suffix_tokens: int
    reused_tokens: int
    prefilled_tokens: int
    dropped_tokens: int
    timings: RequestTimings


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamChunk:
    """A decoded text delta, reasoning delta, finished tool calls, or a terminal error."""

    text: str = ""
    thinking: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    error: Exception | None = None
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextReport:
    """The session's resident context (``explain_context``)."""

    resident_tokens: int
    prefix_tokens: int
    suffix_tokens: int
    generated_tokens: int
    n_ctx: int
    available_tokens: int
    stable_token_hash: str
    manifest_digest: str
    manifest: ContextManifest
    closed: bool
    fatal: bool
    num_prefill_calls: int
    num_prefill_tokens: int
    num_decode_tokens: int
