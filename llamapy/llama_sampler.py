"""``LlamaSampler``, a request's native sampler chain (the engine's ``Sampler``), and
:func:`build_chain`, which orders a chain's samplers from :class:`SamplingParams` as
llama-server does. numpy is imported only when logits are read (log-probabilities)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._native import Context, Model, SamplerChain
from .engine.options import SamplingParams
from .errors import GrammarError, NativeError
from .greedy import GreedyPick
from .lazy_grammar import LazyGrammar

if TYPE_CHECKING:
    import numpy as np

__all__ = ["LlamaSampler", "build_chain", "log_normalizer", "top_logprobs"]

_log = logging.getLogger(__name__)


class LlamaSampler:
    """A request's native sampler chain (the engine's ``Sampler``).

    A chain that only biases logits and picks greedily (temperature 0 with no grammar,
    penalties or DRY; ``ignore_eos`` is such a bias) makes its pick from the logits row with
    ``pick`` (:class:`~llamapy.greedy.GreedyPick`): the token the chain would pick, without
    ``llama_sampler_sample``'s copy of the whole vocabulary. Neither sampler keeps state, so
    nothing is left to accept. With ``lazy`` (a grammar with trigger patterns) each output token
    is watched, and the chain is swapped for one that starts with the grammar once a trigger
    matches (:mod:`llamapy.lazy_grammar`).
    """

    __slots__ = ("_chain", "_ctx", "_lazy", "_pick")

    def __init__(self, chain: SamplerChain, ctx: Context, pick: GreedyPick | None = None,
                 lazy: LazyGrammar | None = None) -> None:
        self._chain = chain
        self._ctx = ctx
        self._pick = pick if lazy is None else None
        self._lazy = lazy

    def sample(self, batch_index: int) -> int:
        """Sample from row ``batch_index`` of the last decode (and accept the token)."""
        if self._pick is not None:
            return self._pick(self._ctx.logits(batch_index))
        token = self._chain.sample(self._ctx, batch_index)
        if self._lazy is not None:
            self._watch(token)
        return token

    def accept(self, token_id: int) -> None:
        """Feed a token that was not sampled (history replay)."""
        self._chain.accept(token_id)
        if self._lazy is not None:
            self._watch(token_id)

    def _watch(self, token: int) -> None:
        """Arm the grammar when ``token`` completes a trigger."""
        lazy = self._lazy
        assert lazy is not None
        hit = lazy.watch(token)
        if hit is None:
            return
        try:
            armed = lazy.armed(self._chain, hit)
        except (NativeError, GrammarError) as exc:  # the grammar cannot read the match
            _log.debug("lazy grammar not armed: %s", exc)
            if not lazy.failed():
                self._drop_lazy()
            return
        self._chain.close()
        self._chain = armed
        self._drop_lazy()

    def _drop_lazy(self) -> None:
        if self._lazy is not None:
            self._lazy.close()
            self._lazy = None

    def top_logprobs(self, batch_index: int, n: int) -> list[tuple[int, float]]:
        """The ``n`` most likely tokens of the row and their log-probabilities (raw logits)."""
        return top_logprobs(self._ctx.logits(batch_index), n)

    def token_logprob(self, batch_index: int, token_id: int) -> float:
        """One token's log-probability in the row (raw logits)."""
        logits = self._ctx.logits(batch_index)
        return float(logits[token_id]) - log_normalizer(logits)

    def close(self) -> None:
        """Free the chain (and a grammar still waiting for its trigger)."""
        self._chain.close()
        self._drop_lazy()


def top_logprobs(logits: np.ndarray, n: int) -> list[tuple[int, float]]:
    """Top-``n`` ``(token, logprob)`` of a logits row, most likely first."""
    import numpy as np

    n = min(n, logits.shape[0])
    top = np.argpartition(logits, -n)[-n:]
    top = top[np.argsort(logits[top])[::-1]]
    log_z = log_normalizer(logits)
    return [(int(t), float(logits[t]) - log_z) for t in top]


def log_normalizer(logits: np.ndarray) -> float:
    """``log(sum(exp(logits)))``, computed stably."""
    import numpy as np

    m = float(logits.max())
    return m + float(np.log(np.exp(logits - m, dtype=np.float64).sum()))


def prefill_tokens(model: Model, text: str) -> list[int]:
    """The tokens of ``text`` a grammar reads before the output (special tokens parsed; a
    space the tokenizer put before a first special token is left out, as llama.cpp does)."""
    if not text:
        return []
    tokens = model.tokenize(text, False, True)
    if tokens and not text[0].isspace() and model.token_to_piece(tokens[0])[:1].isspace():
        tokens = tokens[1:]
    return tokens


def _add_reasoning_budget(chain: SamplerChain, model: Model, p: SamplingParams) -> None:
    """The reasoning budget first, as llama.cpp's sampler applies it: the forced end then
    passes every sampler after it."""
    start, *ends = p.reasoning_tags
    ids = [model.tokenize(end, False, True) for end in ends if end]
    forced = model.tokenize(p.reasoning_budget_message + ends[0], False, True)
    chain.add_reasoning_budget(model.tokenize(start, False, True) if start else [], ids,
                               forced, p.reasoning_budget)


def build_chain(model: Model, p: SamplingParams) -> SamplerChain:
    """A native chain for ``p``: grammar, logit bias, then ``p.samplers`` in their order
    (llama-server's default: penalties, DRY, top-n-sigma, top-k, typical, top-p, min-p, XTC,
    temperature, dynamic when ``dynatemp_range > 0``), then dist(seed). ``temp <= 0`` is
    greedy after the penalties and DRY; mirostat replaces the listed truncation samplers.
    Neutral samplers are left out.
    """
    chain = SamplerChain(model)
    try:
        if p.reasoning_budget >= 0 and p.reasoning_tags:
            _add_reasoning_budget(chain, model, p)
        if p.grammar and not p.grammar_triggers:  # a lazy grammar joins at its trigger
            chain.add_grammar(p.grammar, p.grammar_root,
                              replay=prefill_tokens(model, p.grammar_prefill))
        if p.logit_bias:
            chain.add_logit_bias(p.logit_bias)
        greedy = p.temp <= 0.0
        for name in p.samplers:
            if name in _REPETITION or not (greedy or p.mirostat):
                _ADD[name](chain, p)
        if greedy:
            return chain.add_greedy()
        if p.mirostat:
            chain.add_temp(p.temp)
            if p.mirostat == 1:
                return chain.add_mirostat(p.mirostat_tau, p.mirostat_eta, seed=p.native_seed)
            return chain.add_mirostat_v2(p.mirostat_tau, p.mirostat_eta, seed=p.native_seed)
        return chain.add_dist(p.native_seed)
    except BaseException:
        chain.close()
        raise


def _penalties(chain: SamplerChain, p: SamplingParams) -> None:
    if p.penalty_last_n != 0 and (
        p.penalty_repeat != 1.0 or p.penalty_freq != 0.0 or p.penalty_present != 0.0
    ):
        chain.add_penalties(p.penalty_last_n, p.penalty_repeat, p.penalty_freq,
                            p.penalty_present)


def _dry(chain: SamplerChain, p: SamplingParams) -> None:
    if p.dry_multiplier > 0.0:
        chain.add_dry(p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                      p.dry_penalty_last_n, p.dry_sequence_breakers)


def _temperature(chain: SamplerChain, p: SamplingParams) -> None:
    if p.dynatemp_range > 0.0:
        chain.add_temp_ext(p.temp, p.dynatemp_range, p.dynatemp_exponent)
    else:
        chain.add_temp(p.temp)


def _when(test: Callable[[SamplingParams], bool],
          add: Callable[[SamplerChain, SamplingParams], object]
          ) -> Callable[[SamplerChain, SamplingParams], None]:
    def apply(chain: SamplerChain, p: SamplingParams) -> None:
        if test(p):
            add(chain, p)
    return apply


#: How each sampler name adds itself (neutral settings add nothing).
_ADD: dict[str, Callable[[SamplerChain, SamplingParams], None]] = {
    "penalties": _penalties,
    "dry": _dry,
    "top_n_sigma": _when(lambda p: p.top_n_sigma >= 0.0,
                         lambda c, p: c.add_top_n_sigma(p.top_n_sigma)),
    "top_k": _when(lambda p: p.top_k > 0, lambda c, p: c.add_top_k(p.top_k)),
    "typ_p": _when(lambda p: p.typical_p < 1.0,
                   lambda c, p: c.add_typical(p.typical_p, p.min_keep)),
    "top_p": _when(lambda p: p.top_p < 1.0, lambda c, p: c.add_top_p(p.top_p, p.min_keep)),
    "min_p": _when(lambda p: p.min_p > 0.0, lambda c, p: c.add_min_p(p.min_p, p.min_keep)),
    "xtc": _when(lambda p: p.xtc_probability > 0.0,
                 lambda c, p: c.add_xtc(p.xtc_probability, p.xtc_threshold, p.min_keep,
                                        seed=p.native_seed)),
    "temperature": _temperature,
}
#: Samplers that also apply before greedy and mirostat (they change logits, not the pick).
_REPETITION = frozenset({"penalties", "dry"})
