"""Option dataclasses: the single source of every option name the engine accepts.

``SamplingParams`` mirrors llama-server's sampling defaults (``common_params_sampling``).
``EngineConfig`` holds the server-level scheduling options, ``RequestOptions`` the per-request
ones. Callers that forward user options select them with :func:`sampling_option_keys`,
:func:`request_option_keys` and :func:`engine_option_keys` and build the dataclasses with
:func:`resolve_request_options` / :func:`make_engine_config`, which raise
:class:`~llamapy.errors.UnknownOptionError` for unknown keys instead of dropping them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, cast

from llamapy.errors import InvalidOptionError, UnknownOptionError

__all__ = [
    "LLAMA_DEFAULT_SEED",
    "EngineConfig",
    "EngineTuning",
    "RequestOptions",
    "SamplingParams",
    "engine_option_keys",
    "make_engine_config",
    "request_option_keys",
    "resolve_request_options",
    "sampling_option_keys",
]

#: llama.cpp's "random seed" value; ``seed=-1`` means this.
LLAMA_DEFAULT_SEED = 0xFFFFFFFF

_DRY_BREAKERS = ("\n", ":", '"', "*")


def _check(ok: bool, option: str, message: str) -> None:
    if not ok:
        raise InvalidOptionError(f"{option}: {message}", option=option)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and not (
        isinstance(value, float) and math.isnan(value)
    )


@dataclass(slots=True, frozen=True, kw_only=True)
class SamplingParams:
    """Sampling options with llama-server's defaults.

    ``seed=-1`` means random (the backend passes ``LLAMA_DEFAULT_SEED``); ``temp <= 0`` means
    greedy. ``logit_bias`` maps token id to an additive bias (``-inf`` bans a token).
    ``grammar`` is GBNF text ("" = none), ``grammar_root`` its start rule. ``n_probs > 0`` asks
    for that many top log-probabilities per generated token.
    """

    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    seed: int = -1
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    penalty_last_n: int = 64
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = _DRY_BREAKERS
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))
    grammar: str = ""
    grammar_root: str = "root"
    n_probs: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "float":
                _check(_is_num(value), f.name, f"expected a number, got {value!r}")
            elif f.type == "int":
                _check(_is_int(value), f.name, f"expected an integer, got {value!r}")
        self._check_ranges()
        self._freeze_collections()

    def _check_ranges(self) -> None:
        _check(0.0 <= self.top_p <= 1.0, "top_p", "must be within [0, 1]")
        _check(0.0 <= self.min_p <= 1.0, "min_p", "must be within [0, 1]")
        _check(0.0 <= self.typical_p <= 1.0, "typical_p", "must be within [0, 1]")
        _check(0.0 <= self.xtc_probability <= 1.0, "xtc_probability", "must be within [0, 1]")
        _check(-1 <= self.seed <= LLAMA_DEFAULT_SEED, "seed", "must be -1 or a uint32")
        _check(self.penalty_last_n >= -1, "penalty_last_n", "must be >= -1")
        _check(self.dry_penalty_last_n >= -1, "dry_penalty_last_n", "must be >= -1")
        _check(self.dry_allowed_length >= 0, "dry_allowed_length", "must be >= 0")
        _check(self.mirostat in (0, 1, 2), "mirostat", "must be 0, 1 or 2")
        _check(self.n_probs >= 0, "n_probs", "must be >= 0")
        _check(isinstance(self.grammar, str), "grammar", "must be a GBNF string")
        _check(isinstance(self.grammar_root, str) and bool(self.grammar_root), "grammar_root",
               "must be a non-empty rule name")

    def _freeze_collections(self) -> None:
        breakers = self.dry_sequence_breakers
        _check(not isinstance(breakers, str) and all(isinstance(b, str) for b in breakers),
               "dry_sequence_breakers", "must be a sequence of strings")
        object.__setattr__(self, "dry_sequence_breakers", tuple(breakers))
        bias = self.logit_bias
        _check(isinstance(bias, Mapping), "logit_bias", "must map token id to bias")
        _check(all(_is_int(k) and _is_num(v) for k, v in bias.items()), "logit_bias",
               "must map int token ids to numeric biases")
        object.__setattr__(self, "logit_bias", MappingProxyType(dict(bias)))

    @property
    def native_seed(self) -> int:
        """The seed as libllama takes it (``-1`` -> ``LLAMA_DEFAULT_SEED``)."""
        return LLAMA_DEFAULT_SEED if self.seed == -1 else self.seed


@dataclass(slots=True, frozen=True, kw_only=True)
class RequestOptions:
    """Per-request options (resolved: ``sampling`` already merged with server defaults).

    ``max_tokens=0`` makes a prefill-only request (finish reason ``"prefill"``).
    ``cache_prompt=None`` means the server's default. ``session`` routes requests of one
    conversation to the slot that served it; ``cache_scope`` is the trust boundary for prefix
    reuse (None: one shared pool). ``stop`` strings end generation and are never emitted.
    ``adapters`` is the request's adapter set (``()`` = the base model), opaque to the engine:
    any hashable items, kept in order; the backend interprets it (``LlamaBackend``:
    ``((path, scale), ...)``). Runs of different sets never share a decode call or any KV.
    """

    max_tokens: int = 256
    cache_prompt: bool | None = None
    session: Hashable | None = None
    cache_scope: str | None = None
    adapters: tuple[Hashable, ...] = ()
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        _check(_is_int(self.max_tokens) and self.max_tokens >= 0, "max_tokens",
               f"must be an integer >= 0, got {self.max_tokens!r}")
        _check(self.cache_prompt is None or isinstance(self.cache_prompt, bool),
               "cache_prompt", "must be a bool or None")
        _check(self.cache_scope is None or isinstance(self.cache_scope, str), "cache_scope",
               "must be a string or None")
        _check(isinstance(self.session, Hashable), "session", "must be hashable")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        _check(all(isinstance(s, str) and s for s in stop), "stop",
               "must be non-empty strings")
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "adapters", _adapter_set(self.adapters))
        _check(isinstance(self.sampling, SamplingParams), "sampling", "must be SamplingParams")


def _adapter_set(value: object) -> tuple[Hashable, ...]:
    """``value`` as a hashable tuple (``InvalidOptionError`` otherwise)."""
    _check(isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping),
           "adapters", "must be a sequence")
    items = tuple(cast("Iterable[Hashable]", value))
    try:
        hash(items)
    except TypeError:
        _check(False, "adapters", "items must be hashable")
    return items


@dataclass(slots=True, frozen=True, kw_only=True)
class EngineConfig:
    """Server-level scheduling options (``n_ctx``/``n_batch`` limits come from the backend).

    ``n_batch`` is capped by the backend's ``n_batch``; ``chunk_size`` bounds prefill tokens per
    slot per tick; ``max_queue`` bounds requests waiting for a slot (0 = unlimited).
    ``kv_unified`` must match the backend's. ``prompt_cache_ram_mb`` is the level-2 RAM prompt
    cache budget (0 = off). ``batch_strategy`` is a strategy name (``"decode_maximal"``,
    ``"prefill_priority"``, ``"balanced"``), class or instance (see
    :mod:`llamapy.engine.strategies`). ``sampling`` holds the server's sampling defaults.
    """

    n_parallel: int = 4
    n_batch: int = 2048
    chunk_size: int = 512
    max_queue: int = 64
    cache_prompt: bool = True
    kv_unified: bool = True
    prompt_cache_ram_mb: float = 0
    batch_strategy: Any = "decode_maximal"
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        for name in ("n_parallel", "n_batch", "chunk_size"):
            value = getattr(self, name)
            _check(_is_int(value) and value >= 1, name, f"must be an integer >= 1, got {value!r}")
        _check(_is_int(self.max_queue) and self.max_queue >= 0, "max_queue",
               "must be an integer >= 0 (0 = unlimited)")
        _check(isinstance(self.cache_prompt, bool), "cache_prompt", "must be a bool")
        _check(isinstance(self.kv_unified, bool), "kv_unified", "must be a bool")
        _check(_is_num(self.prompt_cache_ram_mb) and self.prompt_cache_ram_mb >= 0,
               "prompt_cache_ram_mb", "must be a number >= 0")
        from llamapy.engine.strategies import resolve_strategy

        resolve_strategy(self.batch_strategy)  # validate at start, raise InvalidOptionError

    @property
    def prompt_cache_ram_bytes(self) -> int:
        """The RAM prompt cache budget in bytes."""
        return int(self.prompt_cache_ram_mb * 1024 * 1024)


def sampling_option_keys() -> tuple[str, ...]:
    """Names of the sampling options (fields of :class:`SamplingParams`)."""
    return tuple(f.name for f in fields(SamplingParams))


def request_option_keys() -> tuple[str, ...]:
    """Per-request option names: :class:`RequestOptions` fields plus the sampling options."""
    own = tuple(f.name for f in fields(RequestOptions) if f.name != "sampling")
    return own + sampling_option_keys()


def engine_option_keys() -> tuple[str, ...]:
    """Server-level option names: :class:`EngineConfig` fields plus the sampling defaults."""
    own = tuple(f.name for f in fields(EngineConfig) if f.name != "sampling")
    return own + sampling_option_keys()


def _split(options: Mapping[str, Any], own: tuple[str, ...], where: str) -> tuple[dict, dict]:
    sampling_keys = set(sampling_option_keys())
    unknown = set(options) - set(own) - sampling_keys
    if unknown:
        raise UnknownOptionError(unknown, (*own, *sampling_keys), where=where)
    mine = {k: v for k, v in options.items() if k in own}
    sampling = {k: v for k, v in options.items() if k in sampling_keys}
    return mine, sampling


def resolve_request_options(
    overrides: Mapping[str, Any], *, defaults: SamplingParams | None = None
) -> RequestOptions:
    """Build :class:`RequestOptions` from flat per-request keys over the server's sampling
    ``defaults``. Unknown keys raise ``UnknownOptionError``; bad values ``InvalidOptionError``.
    """
    own = tuple(f.name for f in fields(RequestOptions) if f.name != "sampling")
    mine, sampling = _split(overrides, own, "request")
    base = defaults if defaults is not None else SamplingParams()
    return RequestOptions(**mine, sampling=replace(base, **sampling))


def make_engine_config(options: Mapping[str, Any]) -> EngineConfig:
    """Build :class:`EngineConfig` from flat server-level keys (sampling keys become the
    sampling defaults). Unknown keys raise ``UnknownOptionError``."""
    own = tuple(f.name for f in fields(EngineConfig) if f.name != "sampling")
    mine, sampling = _split(options, own, "engine")
    return EngineConfig(**mine, sampling=SamplingParams(**sampling))


@dataclass(slots=True, frozen=True, kw_only=True)
class EngineTuning:
    """Engine heuristics (not server options; tests and simulations adjust them).

    ``min_route_share``: a free slot's cached prefix must cover this share of a prompt to win
    routing. ``ram_min_tokens`` / ``ram_min_fraction``: the RAM cache skips shorter prefixes and
    restores an entry only when this share of it is reusable. ``inflight_dedup``: requests whose
    prefix another slot is computing right now adopt it instead of recomputing it;
    ``follow_min_tokens`` is the least shared remainder worth waiting a tick for.
    ``instability_min_history``: histories shorter than this never raise prefix instability.
    """

    min_route_share: float = 0.1
    ram_min_tokens: int = 32
    ram_min_fraction: float = 0.5
    inflight_dedup: bool = True
    follow_min_tokens: int = 8
    instability_min_history: int = 256
