"""How much work one request may ask for: the serving limits, and the check against them.

Every per-request size that turns into work for the tick thread (each token's stop-string
matching, top log-probabilities, the sampler chain, a grammar's parse) or into a number of
engine requests (choices, prompts, embedding inputs) is bounded by one of these server options.
A request over a limit is refused at the edge with :class:`~llamapy.errors.InvalidOptionError`
naming the field, before it reaches the engine. The defaults are at or above what OpenAI's API
allows where it sets a limit (``n`` <= 128, 20 top log-probabilities, 2048 embedding inputs),
and generous where llama-server sets none.

:class:`RequestLimits` is a base of :class:`~llamapy.options.EngineConfig`, so each limit is a
start option and a ``--max-*`` flag of ``python -m llamapy.serve`` like every other option.
:func:`check_limits` applies the limits that need no model, :func:`check_model_bounds` the
vocabulary's; :func:`fit_windows` fits look-back windows to the context before they reach C.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import accumulate

from llamapy.options._spec import check, is_int, option
from llamapy.options.sampling import RequestOptions, SamplingParams

__all__ = ["RequestLimits", "check_count", "check_embedding_tokens", "check_limits",
           "check_model_bounds", "fit_windows"]


@dataclass(slots=True, frozen=True, kw_only=True)
class RequestLimits:
    """The serving limits on one request (see the module)."""

    max_stop_strings: int = option(32, "most stop strings per request")
    max_stop_length: int = option(256, "longest stop string, in characters")
    max_n_probs: int = option(100, "most top log-probabilities per token (n_probs)")
    max_logit_bias: int = option(1024, "most logit_bias entries per request (after text "
                                 "keys become tokens)")
    max_samplers: int = option(32, "longest sampler chain a request may order")
    max_dry_breakers: int = option(32, "most DRY sequence breakers per request")
    max_dry_breaker_length: int = option(64, "longest DRY sequence breaker, in characters")
    max_grammar_bytes: int = option(256 * 1024, "largest grammar per request, in bytes (a "
                                    "JSON schema counts as the grammar made from it)")
    max_grammar_depth: int = option(256, "deepest nesting of groups in a grammar (libllama's "
                                    "parser recurses once per level)")
    max_choices: int = option(128, "most engine requests one HTTP request may make (n choices "
                              "times prompts)")
    max_embedding_inputs: int = option(2048, "most inputs per embeddings or rerank request")
    max_embedding_tokens: int = option(65536, "most tokens per embeddings or rerank request, "
                                       "all inputs together (the work one request may ask "
                                       "of the embeddings context)")
    max_media_items: int = option(16, "most images and audio clips per request")
    max_media_bytes: int = option(20 * 1024 * 1024, "largest image or audio file per item, in "
                                  "bytes (decoded: base64 and data URLs count what they hold)")
    max_media_seconds: int = option(600, "longest audio clip per item, in seconds")
    max_media_pixels: int = option(1 << 25, "largest image per item, in pixels (width times "
                                   "height, read from its header before it is decoded)")
    max_sample_ms: int = option(1000, "a request whose sampler takes longer than this for "
                                "one token fails (a grammar too costly to apply)")

    def __post_init__(self) -> None:
        for name in self.limit_names():
            value = getattr(self, name)
            check(is_int(value) and value >= 1, name, f"must be an integer >= 1, got {value!r}")

    @classmethod
    def limit_names(cls) -> tuple[str, ...]:
        """The names of the limits (the fields of this class alone)."""
        return tuple(RequestLimits.__dataclass_fields__)


def check_count(count: int, limit: int, option: str, what: str) -> None:
    """``InvalidOptionError`` for ``option`` when ``count`` exceeds ``limit``."""
    check(count <= limit, option, f"at most {limit} {what} per request, got {count}")


def check_embedding_tokens(inputs: Sequence[Sequence[int]], limits: RequestLimits,
                           option: str = "input") -> None:
    """Refuse an embeddings or rerank request of more tokens than ``max_embedding_tokens``."""
    check_count(sum(len(ids) for ids in inputs), limits.max_embedding_tokens, option,
                "tokens (all inputs together)")


def check_limits(options: RequestOptions, limits: RequestLimits) -> None:
    """Refuse ``options`` when they ask for more work than ``limits`` allow."""
    check_count(len(options.stop), limits.max_stop_strings, "stop", "stop strings")
    longest = max(map(len, options.stop), default=0)
    check(longest <= limits.max_stop_length, "stop",
          f"stop strings are at most {limits.max_stop_length} characters, got {longest}")
    _check_sampling(options.sampling, limits)


def _check_sampling(params: SamplingParams, limits: RequestLimits) -> None:
    check(params.n_probs <= limits.max_n_probs, "n_probs",
          f"must be at most {limits.max_n_probs}, got {params.n_probs}")
    check_count(len(params.logit_bias), limits.max_logit_bias, "logit_bias", "entries")
    check_count(len(params.samplers), limits.max_samplers, "samplers", "samplers")
    breakers = params.dry_sequence_breakers
    check_count(len(breakers), limits.max_dry_breakers, "dry_sequence_breakers", "breakers")
    longest = max(map(len, breakers), default=0)
    check(longest <= limits.max_dry_breaker_length, "dry_sequence_breakers",
          f"breakers are at most {limits.max_dry_breaker_length} characters, got {longest}")
    size = len(params.grammar.encode("utf-8", "surrogatepass"))
    check(size <= limits.max_grammar_bytes, "grammar",
          f"at most {limits.max_grammar_bytes} bytes, got {size}")
    depth = grammar_depth(params.grammar)
    check(depth <= limits.max_grammar_depth, "grammar",
          f"groups nest at most {limits.max_grammar_depth} deep, got {depth}")


def grammar_depth(text: str) -> int:
    """The deepest nesting of ``(`` groups in GBNF ``text``, outside string literals, character
    classes and comments: the largest count of opens minus closes over the text's prefixes
    (O(len(text)), in C iterators). A stray ``)`` lowers the count after it, but the parser
    refuses the text at that ``)``, before reaching anything deeper."""
    parens = _NOT_PARENS.sub("", _LITERALS.sub("", text)).encode()
    return max(accumulate(map(_STEP.__getitem__, parens)), default=0)


#: +1 for ``(``, -1 for ``)``.
_STEP = {ord("("): 1, ord(")"): -1}
#: What cannot hold a group: string literals, character classes, comments.
_LITERALS = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*')
_NOT_PARENS = re.compile(r"[^()]+")


def check_model_bounds(params: SamplingParams, n_vocab: int) -> None:
    """Refuse a ``logit_bias`` token outside the model's vocabulary. (``top_k`` above the
    vocabulary and look-back windows longer than the context are not errors: they mean the
    whole vocabulary, the whole context, and the backend passes them on clamped to those.)"""
    bad = next((t for t in params.logit_bias if not 0 <= t < n_vocab), None)
    check(bad is None, "logit_bias", f"token id {bad} is outside the vocabulary [0, {n_vocab})")


def fit_windows(params: SamplingParams, n_ctx_seq: int) -> SamplingParams:
    """``params`` with each look-back window (``penalty_last_n``, ``dry_penalty_last_n``)
    that is ``-1`` ("the context") or longer than ``n_ctx_seq`` set to ``n_ctx_seq``: a
    native sampler allocates its window up front, and takes ``-1`` as "off"."""
    def fit(window: int) -> int:
        return n_ctx_seq if window == -1 or window > n_ctx_seq else window

    penalty, dry = fit(params.penalty_last_n), fit(params.dry_penalty_last_n)
    if (penalty, dry) == (params.penalty_last_n, params.dry_penalty_last_n):
        return params
    return replace(params, penalty_last_n=penalty, dry_penalty_last_n=dry)
