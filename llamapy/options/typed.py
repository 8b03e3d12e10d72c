"""The keyword options of a generation call, typed: :class:`GenerationOptions`.

Generated from the option tree by ``python -m llamapy.options._typed_gen``; do not edit. A
function taking ``**options: Unpack[GenerationOptions]`` (``Unpack`` from ``typing`` on Python
3.11+, from ``typing_extensions`` before) lets editors complete the option names and a type
checker refuse an unknown name or a value of the wrong type.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypedDict

__all__ = ["GenerationOptions"]


class GenerationOptions(TypedDict, total=False):
    """Every keyword ``Server.generate``/``complete``/``stream`` (and their token and async forms)
    take: the request options (:class:`~llamapy.options.RequestOptions`), the sampling options
    (:class:`~llamapy.options.SamplingParams`), the call options
    (:class:`~llamapy.options.CallOptions`) and the other spellings of
    :data:`~llamapy.options.ALIASES` (``temperature`` for ``temp``). All are optional.
    """

    #: most tokens to generate (0 = prefill only)
    max_tokens: int
    #: reuse a cached prompt prefix (None = server's)
    cache_prompt: bool | None
    #: routes a conversation to the slot that served it
    session: Hashable | None
    #: trust boundary of prefix reuse (None = shared)
    cache_scope: str | None
    #: who the request is accounted to; KV is never reused across tenants (None = the default
    #: tenant)
    tenant: str | None
    #: only requests with the same salt reuse each other's KV (None = no salt)
    cache_salt: str | None
    #: prompt prefixes to keep cached: (length in tokens, seconds) pairs, at most 4
    cache_pins: Sequence[tuple[int, float]]
    #: the request's LoRA adapter set (() = none)
    adapters: Sequence[Hashable]
    #: strings that end generation (never emitted)
    stop: str | Sequence[str]
    #: special tokens written out as their text (a chat format's markers; others are left out)
    preserved_tokens: Sequence[int]
    #: speculative decoding: a drafter name, False or settings
    speculative: str | Sequence[str] | bool | Mapping[str, Any] | None
    #: attach the timings so far to each token event
    timings_per_token: bool
    #: emit progress events while the prompt is computed
    return_progress: bool
    #: run on this slot only, waiting while it is busy; ids past the last slot wrap around
    #: (llama-server's id_slot; None or -1 = any slot)
    slot_id: int | None
    #: sampling temperature (<= 0: greedy)
    temp: float
    #: keep only the k most likely tokens (0 = off)
    top_k: int
    #: keep the most likely tokens up to this total probability
    top_p: float
    #: drop tokens below this share of the top token's probability
    min_p: float
    #: top_p, min_p, typical and XTC keep at least this many tokens (0 = no floor)
    min_keep: int
    #: locally typical sampling mass (1 = off)
    typical_p: float
    #: sampling RNG seed (-1 = random)
    seed: int
    #: repetition penalty (1 = off)
    penalty_repeat: float
    #: frequency penalty (0 = off)
    penalty_freq: float
    #: presence penalty (0 = off)
    penalty_present: float
    #: tokens the penalties look back over (-1 = the context)
    penalty_last_n: int
    #: DRY repetition penalty strength (0 = off)
    dry_multiplier: float
    #: DRY penalty base
    dry_base: float
    #: repeats this long or shorter are not DRY-penalised
    dry_allowed_length: int
    #: tokens DRY looks back over (-1 = the context)
    dry_penalty_last_n: int
    #: strings that break DRY's repeat matching
    dry_sequence_breakers: Sequence[str]
    #: keep tokens within n sigmas of the top logit (-1 = off)
    top_n_sigma: float
    #: chance that XTC removes the top tokens (0 = off)
    xtc_probability: float
    #: XTC removes tokens above this probability
    xtc_threshold: float
    #: dynamic temperature range (0 = off)
    dynatemp_range: float
    #: dynamic temperature exponent
    dynatemp_exponent: float
    #: Mirostat version (0 = off, 1 or 2)
    mirostat: int
    #: Mirostat target entropy
    mirostat_tau: float
    #: Mirostat learning rate
    mirostat_eta: float
    #: token id -> additive logit bias (-inf bans the token); on the command line a JSON
    #: object or llama-server's TOKEN_ID(+|-)BIAS, repeatable
    logit_bias: Mapping[int, float]
    #: GBNF grammar the output must match ('' = none)
    grammar: str
    #: start rule of the grammar
    grammar_root: str
    #: text the grammar reads before the output: the end of the prompt it describes (a chat
    #: format's generation prompt; at most 1,024 characters)
    grammar_prefill: str
    #: regexes that switch the grammar on (none: it applies from the first token); the grammar
    #: then reads the output from the match's first group. Matched in linear time (RE2: no
    #: look-arounds or back-references) against the output's last 4,096 bytes
    grammar_triggers: Sequence[str]
    #: most tokens of a reasoning block: past it the block's end is forced (-1 = no bound; the
    #: chat format's tags, see reasoning_tags)
    reasoning_budget: int
    #: text forced before the reasoning block's end when the budget runs out
    reasoning_budget_message: str
    #: the reasoning block's start tag, then its end tags (set by the chat APIs from the
    #: template's format; an empty start tag: the output begins inside the block)
    reasoning_tags: Sequence[str]
    #: top log-probabilities reported per generated token
    n_probs: int
    #: sampler order (names; as a string, llama-server's letters 'edskypmxt'); ';' also
    #: separates names
    samplers: str | Sequence[str]
    #: seconds the call (or each event of a stream) may take (None = no limit; not given = the
    #: method's default)
    timeout: float | None
    #: the request's id, for cancel() from elsewhere (default: a fresh one)
    request_id: Hashable
    #: alias of ``temp``
    temperature: float
    #: alias of ``penalty_repeat``
    repeat_penalty: float
    #: alias of ``penalty_freq``
    frequency_penalty: float
    #: alias of ``penalty_present``
    presence_penalty: float
    #: alias of ``penalty_last_n``
    repeat_last_n: int
    #: alias of ``typical_p``
    typ_p: float
    #: alias of ``max_tokens``
    n_predict: int
    #: alias of ``max_tokens``
    max_completion_tokens: int
    #: alias of ``slot_id``
    id_slot: int | None
    #: alias of ``reasoning_budget``
    reasoning_budget_tokens: int
    #: alias of ``reasoning_budget``
    thinking_budget_tokens: int
