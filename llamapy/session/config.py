"""Session inputs, configs and reports: frozen, slotted, keyword-only dataclasses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from llamapy.chat.delta import ToolCall
from llamapy.chat.parsers import protocol_kind
from llamapy.engine.request import RequestTimings
from llamapy.errors import InvalidOptionError, UnknownOptionError, UnsupportedFeatureError
from llamapy.options import (
    N_CTX,
    REASONING_FORMATS,
    SERVER_OWNED_KEYS,
    TIMEOUTS,
    ContextOptions,
    RequestOptions,
    SamplingParams,
    canonical_name,
    default_n_batch,
    sampling_option_keys,
    tuning_option_keys,
)
from llamapy.options._spec import check, default_of, is_int, is_num
from llamapy.options.speculative import speculative_overrides
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
    "check_shared",
    "decode_sampling",
    "standalone_context_options",
]

STRUCTURED_KINDS = ("none", "json_schema", "json_schema_tool_calls", "grammar")
#: The longest timeout a session takes (30 days; longer is no bound a thread can wait for).
MAX_TIMEOUT_S = 30 * 86_400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterSpec:
    """One LoRA adapter: its digest and scale are part of the manifest identity."""

    path: str
    scale: float = 1.0


def _positive_or_none(value: object, name: str) -> None:
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
    if not ok:
        raise InvalidOptionError(f"{name} must be an integer >= 1 (or None)", option=name)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """How a session is opened.

    ``cache_scope``: the scope its KV is filed under (reuse never crosses scopes).
    ``lease_timeout``: seconds to wait for a free slot before ``LeaseTimeoutError``.
    ``lease_idle_timeout``: seconds the leased slot may sit unused (no primitive running)
    before the server reclaims it for other requests; the session's next primitive then
    raises ``LeaseExpiredError`` (None: never reclaimed, as long as the session lives).
    ``request_timeout``: the *stall* bound: most seconds the session waits without any
    engine event (a token, or a prefill's progress after each chunk), so a long prefill that
    keeps progressing never times out; ``RequestTimeoutError`` past it. A deadline for a
    whole call is the primitive's own ``timeout=`` keyword.
    ``n_ctx`` / ``n_batch`` / ``context_options``: the private context of a standalone session
    (None / empty: the tree's defaults, ``n_ctx`` 8192 and ``n_batch`` ``min(n_ctx, 2048)``);
    ``context_options`` takes context tuning options only (:func:`standalone_context_options`).
    A session on a shared server has the server's context: setting any of them there raises
    (:func:`check_shared`).
    """

    cache_scope: str | None = default_of(RequestOptions, "cache_scope")
    adapters: tuple[AdapterSpec, ...] = ()
    lease_timeout: float = TIMEOUTS.lease
    lease_idle_timeout: float | None = TIMEOUTS.lease_idle
    request_timeout: float = TIMEOUTS.session_event
    n_ctx: int | None = None
    n_batch: int | None = None
    context_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        check(is_num(self.lease_timeout) and 0 <= self.lease_timeout <= MAX_TIMEOUT_S,
              "lease_timeout", f"must be within [0, {MAX_TIMEOUT_S:g}] seconds")
        check(is_num(self.request_timeout) and 0 < self.request_timeout <= MAX_TIMEOUT_S,
              "request_timeout", f"must be within (0, {MAX_TIMEOUT_S:g}] seconds")
        idle = self.lease_idle_timeout
        check(idle is None or (is_num(idle) and 0 < idle <= MAX_TIMEOUT_S), "lease_idle_timeout",
              f"must be a positive number of seconds up to {MAX_TIMEOUT_S:g}, or None, got "
              f"{idle!r}")
        _positive_or_none(self.n_ctx, "n_ctx")
        _positive_or_none(self.n_batch, "n_batch")
        if not isinstance(self.context_options, Mapping):
            raise InvalidOptionError("context_options must be a mapping",
                                     option="context_options")
        object.__setattr__(self, "adapters", tuple(self.adapters))
        object.__setattr__(self, "context_options", MappingProxyType(dict(self.context_options)))


#: The knobs that describe a standalone session's private context.
STANDALONE_KNOBS = ("n_ctx", "n_batch", "context_options")


def standalone_context_options(config: SessionConfig) -> ContextOptions:
    """The private context of a standalone session: one sequence, ``config.n_ctx`` /
    ``config.n_batch`` (or the tree's defaults) and the tuning in ``config.context_options``.

    Raises :class:`UnknownOptionError` for a key that is no context option and
    :class:`InvalidOptionError` for one the session sizes itself (``n_ctx``, ``n_batch``,
    ``n_seq_max``, ``kv_unified``): set ``config.n_ctx`` / ``config.n_batch`` instead.
    """
    tuning = dict(config.context_options)
    owned = sorted(set(tuning) & set(SERVER_OWNED_KEYS))
    if owned:
        raise InvalidOptionError(
            f"context_options may not set {', '.join(owned)}: a standalone session sizes its "
            "context from SessionConfig.n_ctx / n_batch (one sequence)", option=owned[0])
    unknown = set(tuning) - set(tuning_option_keys())
    if unknown:
        raise UnknownOptionError(unknown, tuning_option_keys(), where="context_options")
    n_ctx = config.n_ctx if config.n_ctx is not None else N_CTX
    n_batch = config.n_batch if config.n_batch is not None else default_n_batch(n_ctx)
    tuning.setdefault("n_ubatch", min(n_batch, 512))
    return ContextOptions(n_ctx=n_ctx, n_batch=n_batch, n_seq_max=1, **tuning)


def check_shared(config: SessionConfig) -> None:
    """Raise :class:`InvalidOptionError` naming the knob when ``config`` sizes a context: a
    session on a shared server uses the server's context (set ``n_ctx`` etc. on the server)."""
    for knob in STANDALONE_KNOBS:
        value = getattr(config, knob)
        if (bool(value) if knob == "context_options" else value is not None):
            raise InvalidOptionError(
                f"SessionConfig.{knob} applies to standalone sessions only; a session on a "
                "shared server uses the server's context (set it on the Server)", option=knob)


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
    """The volatile tail (a diff, test output, the user's turn, a screenshot): ``text`` or
    ``token_ids`` (no BOS is added). ``media``: images (or audio) for a model served with a
    projector, each standing where the next media marker (``<__media__>``) of ``text`` is.
    ``manifest``, if given, must have the resident identity."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    manifest: ContextManifest | None = None
    media: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        if (self.text is None) == (self.token_ids is None):
            raise InvalidOptionError("SuffixInput needs exactly one of text, token_ids",
                                     option="text")
        if self.token_ids is not None:
            object.__setattr__(self, "token_ids", tuple(self.token_ids))
        media = tuple(self.media)
        if not all(isinstance(item, bytes | bytearray | memoryview) for item in media):
            raise InvalidOptionError("SuffixInput.media holds the bytes of each item",
                                     option="media")
        if media and self.text is None:
            raise InvalidOptionError("SuffixInput.media needs text with a media marker for "
                                     "each item", option="media")
        object.__setattr__(self, "media", tuple(bytes(item) for item in media))


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
    """One decode pass. ``max_tokens=None`` decodes until EOG or the context is full (``0``
    generates nothing, as on the server); unset
    sampling fields take the server's defaults. ``parser_protocols``: e.g. ``("think",
    "hermes")``; when the resident text ends with the reasoning start marker (a suffix that
    opens ``<think>``), the output is parsed as starting inside reasoning.
    ``reasoning_format``: one of :data:`~llamapy.options.REASONING_FORMATS`: ``"auto"`` or
    ``"deepseek"`` (reasoning goes to ``thinking``) or ``"none"`` (left in ``text``). The
    sampling fields use the OpenAI spelling (``temperature``); :func:`decode_sampling` maps
    them onto ``SamplingParams`` through the alias table. ``speculative`` takes the engine's
    per-request form (a drafter name such as ``"ngram"``, ``False``, or a mapping like
    ``{"type": "ngram", "n_max": 8}``; None = the server's default): the n-gram drafter looks
    up the whole resident sequence, so code the model rewrites from the stable prefix is
    drafted from it. Every field is checked when the config is built (``InvalidOptionError``
    naming it, ``UnsupportedFeatureError`` for an unknown protocol or format): the sampling
    fields by the option tree's checks of ``SamplingParams`` (type, range)."""

    max_tokens: int | None = default_of(RequestOptions, "max_tokens")
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    parser_protocols: tuple[str, ...] = ()
    reasoning_format: str = "auto"
    structured_output: StructuredOutput = field(default_factory=StructuredOutput)
    speculative: Any = None

    def __post_init__(self) -> None:
        speculative_overrides(self.speculative)  # validate now (InvalidOptionError)
        if self.max_tokens is not None and not (is_int(self.max_tokens) and
                                                self.max_tokens >= 0):
            raise InvalidOptionError("max_tokens must be an integer >= 0 (or None)",
                                     option="max_tokens")
        _check_sampling(self)
        if not isinstance(self.reasoning_format, str) or \
                self.reasoning_format not in REASONING_FORMATS:
            raise UnsupportedFeatureError(f"reasoning_format:{self.reasoning_format}")
        protocols = self.parser_protocols
        check(not isinstance(protocols, str | bytes) and isinstance(protocols, list | tuple)
              and all(isinstance(p, str) for p in protocols), "parser_protocols",
              "must be a sequence of protocol names")
        for name in protocols:
            protocol_kind(name)  # an unknown name raises UnsupportedFeatureError
        object.__setattr__(self, "parser_protocols", tuple(protocols))


def _check_sampling(config: DecodeConfig) -> None:
    """Check the sampling fields' types and ranges by the option tree's own checks (those of
    ``SamplingParams``), the error naming the field as ``DecodeConfig`` spells it."""
    try:
        SamplingParams(**decode_sampling(config))
    except InvalidOptionError as exc:
        tree_name = exc.option or ""
        name = next((f.name for f in fields(config) if canonical_name(f.name) == tree_name),
                    tree_name)
        message = str(exc).removeprefix(f"{tree_name}: ")
        raise InvalidOptionError(f"{name}: {message}", option=name) from None


def decode_sampling(config: DecodeConfig) -> dict[str, Any]:
    """The sampling options ``config`` sets, under their ``SamplingParams`` names (mapped
    through :data:`llamapy.options.ALIASES`: ``temperature`` -> ``temp``)."""
    sampling = set(sampling_option_keys())
    out: dict[str, Any] = {}
    for f in fields(config):
        name = canonical_name(f.name)
        value = getattr(config, f.name)
        if name in sampling and value is not None:
            out[name] = value
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixStatus:
    """What ``ensure_prefix`` reused versus computed.

    ``cold``: nothing was reused (a first prefill, a prefix that diverges at its first token,
    or a changed identity); :attr:`warm` is the opposite (``reused_tokens > 0``).
    ``identity_changed``: the prefix's manifest identity differed from the resident one, so
    the resident KV was dropped whatever the tokens (implies ``cold``).
    """

    prefix_tokens: int
    reused_tokens: int
    prefilled_tokens: int
    dropped_tokens: int
    cold: bool
    identity_changed: bool
    timings: RequestTimings

    @property
    def warm(self) -> bool:
        """Whether resident KV was reused."""
        return self.reused_tokens > 0


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
