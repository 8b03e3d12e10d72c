"""Greedy picks read straight from a logits row, as llama.cpp's greedy sampler makes them.

``llama_sampler_sample`` copies the whole vocabulary into a candidate array before any sampler
runs (49k entries for SmolLM2: ~220 us a token on a small CPU, more than the rest of a token's
Python). A chain that is greedy alone, or a logit bias then greedy (``ignore_eos`` bans the
end-of-generation tokens that way), needs none of it: the pick is the first highest logit
after the bias, found with one ``argmax`` over the row (~50 us). For finite logits it is the
token llama.cpp picks: the bias is added in float32 as ``llama_sampler_logit_bias`` adds it
(tokens outside the vocabulary ignored), and ties go to the lowest token id, as greedy's
strict ``>`` scan does. A bias that leaves no token (every one at ``-inf``) raises
:class:`~llamapy.errors.NoCandidateError`, as the native chain does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .errors import NoCandidateError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["GreedyPick", "greedy_pick_for"]

#: Chains (by sampler names) whose pick :class:`GreedyPick` makes without the chain.
_FAST_CHAINS = (["greedy"], ["logit_bias", "greedy"])


class GreedyPick:
    """The greedy pick of a logits row under a fixed logit bias (see the module docstring)."""

    __slots__ = ("_ids", "_idset", "_values")

    def __init__(self, bias: Mapping[int, float], n_vocab: int) -> None:
        import numpy as np

        kept = {int(t): float(b) for t, b in bias.items() if 0 <= int(t) < n_vocab}
        self._idset = frozenset(kept)
        self._ids = np.fromiter(kept, dtype=np.intp, count=len(kept))
        with np.errstate(over="ignore"):  # a bias past float32's range is inf, as in C
            self._values = np.fromiter(kept.values(), dtype=np.float32, count=len(kept))

    def __call__(self, row: np.ndarray) -> int:
        """The token greedy picks from ``row`` (float32 logits) after the bias."""
        top = int(row.argmax())
        if not self._idset:
            return top
        biased = row[self._ids] + self._values  # float32, as C adds them
        if top not in self._idset:
            best = row[top]
            wins = (biased > best) | ((biased == best) & (self._ids < top))
            if not wins.any():
                return top
        row = row.copy()
        row[self._ids] = biased
        pick = int(row.argmax())
        if not row[pick] > float("-inf"):
            raise NoCandidateError("no token is left to sample: the logit bias excludes every "
                                   "candidate")
        return pick


def greedy_pick_for(names: list[str], bias: Mapping[int, float] | None,
                    n_vocab: int) -> GreedyPick | None:
    """A :class:`GreedyPick` standing in for a chain of samplers ``names`` built with logit
    ``bias``, or None when the chain does more than bias and greedy."""
    if names not in _FAST_CHAINS:
        return None
    return GreedyPick(bias or {}, n_vocab)
