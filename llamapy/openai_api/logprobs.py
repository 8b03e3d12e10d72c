"""Token log-probabilities in the OpenAI shapes (chat ``logprobs.content``, legacy completions).

The engine reports, per generated token, the ``n_probs`` most likely ``(token_id, logprob)``
pairs of the raw distribution, plus the sampled token's own pair when it is not among them, so
the sampled token's logprob is always exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..server import ModelInfo

#: Candidates requested per token at least (the sampled token's pair always comes along).
MIN_CANDIDATES = 1

Candidates = Sequence[tuple[int, float]]


def token_text(model: ModelInfo, token_id: int) -> str:
    """A token's text (special tokens rendered; invalid UTF-8 replaced)."""
    return model.token_to_piece(token_id, True).decode("utf-8", "replace")


def _entry(model: ModelInfo, token_id: int, logprob: float) -> dict[str, Any]:
    piece = model.token_to_piece(token_id, True)
    return {"token": piece.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(piece)}


def sampled_logprob(token_id: int, candidates: Candidates) -> float:
    """The sampled token's logprob among ``candidates`` (the engine always includes it; the
    smallest listed one is only a fallback for candidates from elsewhere)."""
    for candidate, logprob in candidates:
        if candidate == token_id:
            return logprob
    return min((logprob for _, logprob in candidates), default=0.0)


def chat_logprob(model: ModelInfo, token_id: int, candidates: Candidates | None, top: int
                 ) -> dict[str, Any]:
    """One entry of ``choices[].logprobs.content``."""
    candidates = candidates or ()
    out = _entry(model, token_id, sampled_logprob(token_id, candidates))
    out["top_logprobs"] = [_entry(model, t, lp) for t, lp in list(candidates)[:top]]
    return out


def chat_logprobs(model: ModelInfo, token_ids: Sequence[int], per_token: Sequence[Candidates],
                  top: int) -> dict[str, Any]:
    """``choices[].logprobs`` of a whole chat response."""
    pairs = zip(token_ids, per_token, strict=False)
    return {"content": [chat_logprob(model, t, c, top) for t, c in pairs], "refusal": None}


def legacy_logprobs(model: ModelInfo, token_ids: Sequence[int], per_token: Sequence[Candidates],
                    top: int, offset: int = 0) -> dict[str, Any]:
    """``choices[].logprobs`` of a text completion (``tokens``, ``token_logprobs``, ...)."""
    tokens, values, tops, offsets = [], [], [], []
    for token_id, candidates in zip(token_ids, per_token, strict=False):
        text = token_text(model, token_id)
        tokens.append(text)
        values.append(sampled_logprob(token_id, candidates))
        tops.append({token_text(model, t): lp for t, lp in list(candidates)[:top]})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
            "text_offset": offsets}
