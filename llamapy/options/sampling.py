"""Sampling and per-request options: the single source of their names and defaults.

``SamplingParams`` mirrors llama-server's sampling defaults (``common_params_sampling``);
``RequestOptions`` holds the other per-request options. :func:`resolve_request_options` builds
them from flat keys and raises :class:`~llamapy.errors.UnknownOptionError` for unknown keys
instead of dropping them (llama-server / OpenAI spellings are mapped by the HTTP layer through
:data:`llamapy.options.ALIASES`, never here).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, cast

from llamapy.errors import UnknownOptionError
from llamapy.options._spec import (
    check,
    check_typed_fields,
    is_finite,
    is_int,
    option,
    option_factory,
    option_names,
)
from llamapy.options.cache_pins import check_cache_pins
from llamapy.options.samplers import DEFAULT_SAMPLERS, sampler_names
from llamapy.options.speculative import speculative_overrides
from llamapy.options.triggers import compile_triggers

__all__ = [
    "LLAMA_DEFAULT_SEED",
    "RequestOptions",
    "SamplingParams",
    "request_option_keys",
    "resolve_request_options",
    "sampling_option_keys",
]

#: llama.cpp's "random seed" value; ``seed=-1`` means this.
LLAMA_DEFAULT_SEED = 0xFFFFFFFF
#: The largest value of a C ``int32_t`` (every int option that reaches C as one fits it).
INT32_MAX = 2**31 - 1

_DRY_BREAKERS = ("\n", ":", '"', "*")


def _no_bias() -> Mapping[int, float]:
    return MappingProxyType({})


@dataclass(slots=True, frozen=True, kw_only=True)
class SamplingParams:
    """Sampling options with llama-server's defaults.

    ``seed=-1`` means random (the backend passes ``LLAMA_DEFAULT_SEED``); ``temp <= 0`` means
    greedy. ``logit_bias`` maps token id to an additive bias (``-inf`` bans a token).
    ``grammar`` is GBNF text ("" = none), ``grammar_root`` its start rule; with
    ``grammar_triggers`` the grammar is lazy (llama.cpp's trigger patterns: free text until one
    matches, then the grammar from the match's first group on). ``n_probs > 0`` asks
    for that many top log-probabilities per generated token. ``samplers`` orders the chain
    (llama-server's names, aliases and letters, see :mod:`llamapy.options.samplers`); a
    sampler left out is not applied.
    """

    temp: float = option(0.8, "sampling temperature (<= 0: greedy)",
                         flags=("--temperature",))
    top_k: int = option(40, "keep only the k most likely tokens (0 = off)")
    top_p: float = option(0.95, "keep the most likely tokens up to this total probability")
    min_p: float = option(0.05, "drop tokens below this share of the top token's probability")
    min_keep: int = option(0, "top_p, min_p, typical and XTC keep at least this many tokens "
                           "(0 = no floor)")
    typical_p: float = option(1.0, "locally typical sampling mass (1 = off)",
                             flags=("--typical",))
    seed: int = option(-1, "sampling RNG seed (-1 = random)", flags=("-s",))
    penalty_repeat: float = option(1.0, "repetition penalty (1 = off)",
                                  flags=("--repeat-penalty",))
    penalty_freq: float = option(0.0, "frequency penalty (0 = off)",
                                flags=("--frequency-penalty",))
    penalty_present: float = option(0.0, "presence penalty (0 = off)",
                                   flags=("--presence-penalty",))
    penalty_last_n: int = option(64, "tokens the penalties look back over (-1 = the context)",
                                flags=("--repeat-last-n",))
    dry_multiplier: float = option(0.0, "DRY repetition penalty strength (0 = off)")
    dry_base: float = option(1.75, "DRY penalty base")
    dry_allowed_length: int = option(2, "repeats this long or shorter are not DRY-penalised")
    dry_penalty_last_n: int = option(-1, "tokens DRY looks back over (-1 = the context)")
    dry_sequence_breakers: tuple[str, ...] = option(
        _DRY_BREAKERS, "strings that break DRY's repeat matching", accepts="Sequence[str]")
    top_n_sigma: float = option(-1.0, "keep tokens within n sigmas of the top logit (-1 = off)",
                                flags=("--top-nsigma",))
    xtc_probability: float = option(0.0, "chance that XTC removes the top tokens (0 = off)")
    xtc_threshold: float = option(0.1, "XTC removes tokens above this probability")
    dynatemp_range: float = option(0.0, "dynamic temperature range (0 = off)")
    dynatemp_exponent: float = option(1.0, "dynamic temperature exponent",
                                     flags=("--dynatemp-exp",))
    mirostat: int = option(0, "Mirostat version (0 = off, 1 or 2)")
    mirostat_tau: float = option(5.0, "Mirostat target entropy", flags=("--mirostat-ent",))
    mirostat_eta: float = option(0.1, "Mirostat learning rate", flags=("--mirostat-lr",))
    logit_bias: Mapping[int, float] = option_factory(
        _no_bias, "token id -> additive logit bias (-inf bans the token); on the command "
        "line a JSON object or llama-server's TOKEN_ID(+|-)BIAS, repeatable", flags=("-l",))
    grammar: str = option("", "GBNF grammar the output must match ('' = none)")
    grammar_root: str = option("root", "start rule of the grammar")
    grammar_prefill: str = option(
        "", "text the grammar reads before the output: the end of the prompt it describes "
        "(a chat format's generation prompt; at most 1,024 characters)")
    grammar_triggers: tuple[str, ...] = option(
        (), "regexes that switch the grammar on (none: it applies from the first token); the "
        "grammar then reads the output from the match's first group. Matched in linear time "
        "(RE2: no look-arounds or back-references) against the output's last 4,096 bytes",
        accepts="Sequence[str]")
    reasoning_budget: int = option(
        -1, "most tokens of a reasoning block: past it the block's end is forced (-1 = no "
        "bound; the chat format's tags, see reasoning_tags)")
    reasoning_budget_message: str = option(
        "", "text forced before the reasoning block's end when the budget runs out")
    reasoning_tags: tuple[str, ...] = option(
        (), "the reasoning block's start tag, then its end tags (set by the chat APIs from the "
        "template's format; an empty start tag: the output begins inside the block)",
        accepts="Sequence[str]")
    n_probs: int = option(0, "top log-probabilities reported per generated token")
    samplers: tuple[str, ...] = option(
        DEFAULT_SAMPLERS, "sampler order (names; as a string, llama-server's letters "
        "'edskypmxt'); ';' also separates names", accepts="str | Sequence[str]")

    def __post_init__(self) -> None:
        object.__setattr__(self, "samplers", sampler_names(self.samplers))
        check_typed_fields(self)
        self._check_ranges()
        self._freeze_collections()

    def _check_ranges(self) -> None:
        check(0.0 <= self.top_p <= 1.0, "top_p", "must be within [0, 1]")
        check(0.0 <= self.min_p <= 1.0, "min_p", "must be within [0, 1]")
        check(0.0 <= self.typical_p <= 1.0, "typical_p", "must be within [0, 1]")
        check(0.0 <= self.xtc_probability <= 1.0, "xtc_probability", "must be within [0, 1]")
        check(-1 <= self.seed <= LLAMA_DEFAULT_SEED, "seed", "must be -1 or a uint32")
        check(0 <= self.top_k <= INT32_MAX, "top_k", "must be within [0, 2**31 - 1]")
        check(0 <= self.min_keep <= INT32_MAX, "min_keep", "must be within [0, 2**31 - 1]")
        for name in ("penalty_last_n", "dry_penalty_last_n"):
            check(-1 <= getattr(self, name) <= INT32_MAX, name,
                  "must be within [-1, 2**31 - 1]")
        check(0 <= self.dry_allowed_length <= INT32_MAX, "dry_allowed_length",
              "must be within [0, 2**31 - 1]")
        check(self.mirostat in (0, 1, 2), "mirostat", "must be 0, 1 or 2")
        check(0 <= self.n_probs <= INT32_MAX, "n_probs", "must be within [0, 2**31 - 1]")
        check(isinstance(self.grammar, str), "grammar", "must be a GBNF string")
        check(isinstance(self.grammar_root, str) and bool(self.grammar_root), "grammar_root",
              "must be a non-empty rule name")
        check(isinstance(self.grammar_prefill, str) and len(self.grammar_prefill) <= 1024,
              "grammar_prefill", "must be a string of at most 1,024 characters")
        check(is_int(self.reasoning_budget) and -1 <= self.reasoning_budget <= INT32_MAX,
              "reasoning_budget", "must be -1 (no bound) or a number of tokens")
        check(isinstance(self.reasoning_budget_message, str)
              and len(self.reasoning_budget_message) <= 1024, "reasoning_budget_message",
              "must be a string of at most 1,024 characters")

    def _freeze_collections(self) -> None:
        breakers = self.dry_sequence_breakers
        check(isinstance(breakers, list | tuple) and all(isinstance(b, str) for b in breakers),
              "dry_sequence_breakers", "must be a sequence of strings")
        object.__setattr__(self, "dry_sequence_breakers", tuple(breakers))
        tags = self.reasoning_tags
        check(isinstance(tags, list | tuple) and len(tags) <= 8 and all(
            isinstance(t, str) and len(t) <= 64 for t in tags) and (not tags or len(tags) >= 2),
            "reasoning_tags", "must be a start tag and one to seven end tags (64 characters "
            "each at most)")
        object.__setattr__(self, "reasoning_tags", tuple(tags))
        triggers = compile_triggers(self.grammar_triggers).patterns  # RE2: linear time
        check(not triggers or bool(self.grammar), "grammar_triggers", "need a grammar")
        object.__setattr__(self, "grammar_triggers", triggers)
        bias = self.logit_bias
        check(isinstance(bias, Mapping), "logit_bias", "must map token id to bias")
        check(all(is_int(k) and (is_finite(v) or v == -math.inf) for k, v in bias.items()),
              "logit_bias", "must map int token ids to finite biases (-inf bans a token)")
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
    conversation to the slot that served it (a string, a number, or a small tuple of them: see
    :data:`SESSION_KEY_CHARS`); ``cache_scope`` is the trust boundary for prefix
    reuse (None: one shared pool). ``tenant`` is who the request is accounted to: KV is never
    reused across tenants (``cache_scope`` is a sub-scope inside the tenant), and fair share,
    per-tenant bounds and cache budgets count by it (None: the default tenant). Over HTTP it
    comes from the API key, never from the body. ``cache_salt`` isolates the request's reuse
    inside its tenant and scope: only requests with the same salt share KV with it (vLLM's
    field; the engine keeps a digest of it, never the salt). ``stop`` strings end generation
    and are never emitted. ``cache_pins`` keeps prompt prefixes in the prompt cache for a
    time: ``(length, ttl_s)`` pairs (see :mod:`llamapy.options.cache_pins`).
    ``adapters`` is the request's adapter set (``()`` = the base model), opaque to the engine:
    any hashable items, kept in order; the backend interprets it (``LlamaBackend``:
    ``((path, scale), ...)``). Runs of different sets never share a decode call or any KV.
    ``speculative`` overrides the server's speculative decoding settings (a drafter name,
    ``False``, or a mapping of :class:`~llamapy.options.speculative.SpeculativeParams` fields;
    stored as validated field overrides, None = the server's).
    ``timings_per_token`` attaches the timings so far to every token event;
    ``return_progress`` emits a progress event before and after each prompt chunk
    (llama-server's request fields of the same names). ``slot_id`` pins the request to one
    slot, as llama-server's ``id_slot``: it waits while that slot is busy or leased, and
    ``slot_id % n_parallel`` is taken (llama-server wraps an id past the last slot). A slot
    holding another ``tenant``'s request, lease or KV is never taken for it: the request is
    refused with :class:`~llamapy.errors.PermissionDeniedError` (403).
    """

    max_tokens: int = option(256, "most tokens to generate (0 = prefill only)")
    cache_prompt: bool | None = option(None, "reuse a cached prompt prefix (None = server's)")
    session: Hashable | None = option(None, "routes a conversation to the slot that served it")
    cache_scope: str | None = option(None, "trust boundary of prefix reuse (None = shared)")
    tenant: str | None = option(None, "who the request is accounted to; KV is never reused "
                                "across tenants (None = the default tenant)")
    cache_salt: str | None = option(None, "only requests with the same salt reuse each "
                                    "other's KV (None = no salt)")
    cache_pins: tuple[tuple[int, float], ...] = option(
        (), "prompt prefixes to keep cached: (length in tokens, seconds) pairs, at most 4",
        accepts="Sequence[tuple[int, float]]")
    adapters: tuple[Hashable, ...] = option((), "the request's LoRA adapter set (() = none)",
                                            accepts="Sequence[Hashable]")
    stop: tuple[str, ...] = option((), "strings that end generation (never emitted)",
                                   accepts="str | Sequence[str]")
    preserved_tokens: tuple[int, ...] = option(
        (), "special tokens written out as their text (a chat format's markers; others are "
        "left out)", accepts="Sequence[int]")
    speculative: Any = option(None, "speculative decoding: a drafter name, False or settings",
                              accepts="str | Sequence[str] | bool | Mapping[str, Any] | None")
    sampling: SamplingParams = option_factory(SamplingParams, "the request's sampling options")
    timings_per_token: bool = option(False, "attach the timings so far to each token event")
    return_progress: bool = option(False, "emit progress events while the prompt is computed")
    slot_id: int | None = option(None, "run on this slot only, waiting while it is busy; ids "
                                 "past the last slot wrap around (llama-server's id_slot; "
                                 "None or -1 = any slot)")

    def __post_init__(self) -> None:
        check(is_int(self.max_tokens) and self.max_tokens >= 0, "max_tokens",
              f"must be an integer >= 0, got {self.max_tokens!r}")
        check(self.cache_prompt is None or isinstance(self.cache_prompt, bool),
              "cache_prompt", "must be a bool or None")
        for name, least, most in (("cache_scope", 0, SCOPE_CHARS),
                                  ("cache_salt", 1, SCOPE_CHARS), ("tenant", 1, TENANT_CHARS)):
            value = getattr(self, name)
            check(value is None or (isinstance(value, str) and least <= len(value) <= most
                                    and value.isprintable()), name,
                  f"must be None or a printable string of {least} to {most} characters")
        check(self.tenant is None or "/" not in self.tenant, "tenant", "must not contain '/'")
        check(_small_key(self.session, [SESSION_KEY_ITEMS]), "session",
              f"must be a string (at most {SESSION_KEY_CHARS} characters), a number, or a "
              f"tuple of at most {SESSION_KEY_ITEMS} of them")
        check(isinstance(self.stop, str | list | tuple), "stop",
              "must be a string or a list of strings")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        check(all(isinstance(s, str) and s for s in stop), "stop", "must be non-empty strings")
        object.__setattr__(self, "stop", stop)
        preserved = self.preserved_tokens
        check(isinstance(preserved, list | tuple) and len(preserved) <= MAX_PRESERVED
              and all(is_int(t) and 0 <= t <= INT32_MAX for t in preserved),
              "preserved_tokens", f"must be at most {MAX_PRESERVED} token ids")
        object.__setattr__(self, "preserved_tokens", tuple(sorted(set(preserved))))
        object.__setattr__(self, "adapters", _adapter_set(self.adapters))
        object.__setattr__(self, "cache_pins", check_cache_pins(self.cache_pins))
        spec = speculative_overrides(self.speculative)
        object.__setattr__(self, "speculative", None if spec is None else MappingProxyType(spec))
        check(isinstance(self.sampling, SamplingParams), "sampling", "must be SamplingParams")
        for name in ("timings_per_token", "return_progress"):
            check(isinstance(getattr(self, name), bool), name, "must be a boolean")
        check(self.slot_id is None or (is_int(self.slot_id) and self.slot_id >= -1), "slot_id",
              f"must be an integer >= -1 or None, got {self.slot_id!r}")
        if self.slot_id == -1:
            object.__setattr__(self, "slot_id", None)


#: Most ``preserved_tokens`` of a request.
MAX_PRESERVED = 256

#: The longest ``cache_scope`` / ``cache_salt`` and ``tenant``.
SCOPE_CHARS = 256
TENANT_CHARS = 64

#: The largest ``session``: the engine hashes it for every queued run at every admission (a
#: tuple's hash is not cached), so its size must not be the client's choice.
SESSION_KEY_CHARS = 256
SESSION_KEY_ITEMS = 16


def _small_key(value: object, budget: list[int]) -> bool:
    """Whether ``value`` is None, a bool, an int or float of at most 64 bits, a string of at
    most :data:`SESSION_KEY_CHARS`, or a tuple of those holding at most ``budget[0]`` items in
    all (checked without walking a larger one)."""
    if value is None or isinstance(value, bool | float):
        return True
    if isinstance(value, int):
        return value.bit_length() <= 64
    if isinstance(value, str):
        return len(value) <= SESSION_KEY_CHARS
    if not isinstance(value, tuple) or len(value) > budget[0]:
        return False
    budget[0] -= len(value)
    return all(_small_key(item, budget) for item in value)


def _hashable(value: object) -> bool:
    """Whether ``hash(value)`` works (a tuple holding a list passes ``isinstance(Hashable)``
    and fails here)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _adapter_set(value: object) -> tuple[Hashable, ...]:
    """``value`` as a hashable tuple (``InvalidOptionError`` otherwise)."""
    check(isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping),
          "adapters", "must be a sequence")
    items = tuple(cast("Iterable[Hashable]", value))
    check(_hashable(items), "adapters", "items must be hashable")
    return items


def sampling_option_keys() -> tuple[str, ...]:
    """Names of the sampling options (fields of :class:`SamplingParams`)."""
    return option_names(SamplingParams)


def request_option_keys() -> tuple[str, ...]:
    """Per-request option names: :class:`RequestOptions` fields plus the sampling options."""
    return option_names(RequestOptions, exclude=("sampling",)) + sampling_option_keys()


def split_sampling(options: Mapping[str, Any], own: tuple[str, ...], where: str
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(own options, sampling options)`` of flat ``options``; unknown keys raise."""
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
    own = option_names(RequestOptions, exclude=("sampling",))
    mine, sampling = split_sampling(overrides, own, "request")
    base = defaults if defaults is not None else SamplingParams()
    return RequestOptions(**mine, sampling=replace(base, **sampling))
