"""Usage and timings of a response, with the cache explanation no peer gives.

``timings`` keeps llama-server's keys (``prompt_n``, ``prompt_ms``, ``predicted_n``,
``predicted_per_second``, ``cache_n``, ...) and adds where the reused prompt prefix came from
(``cache_source``: ``own`` slot, ``donor`` slot, ``ram`` cache, ``inflight``) and where the
prompt diverged from the best cached prefix (``cache_diverged_at``, the first prompt token
that had to be computed, with a few tokens of text there in ``cache_diverged_text``).

No value is ever ``null`` (llama-server's rule: clients sum and plot these): a rate or
per-token time that cannot be measured (no prompt computed, a single generated token, whose
logits came with the prompt) is ``0.0``; ``cache_diverged_at`` and ``ttft_ms`` are left out
when there is no such point (the whole prompt matched; no token yet). The two text fields,
``cache_source`` and ``cache_diverged_text``, are there only when a prefix was reused, so the
timings of a request that reused nothing are all numbers, as llama-server's are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import __version__
from .._pins import LLAMA_CPP_COMMIT
from ..engine import ProgressEvent, RequestTimings
from ..server import ModelInfo, Usage

#: ``system_fingerprint`` of every OpenAI response: the serving build (llamapy's version and the
#: pinned llama.cpp commit), where llama-server names its own build (``b<build>-<commit>``).
SYSTEM_FINGERPRINT = f"llamapy-{__version__}-llama.cpp-{LLAMA_CPP_COMMIT}"

#: Prompt tokens shown around the divergence point.
DIVERGED_TEXT_TOKENS = 8

#: ``finish_reason`` by engine finish reason.
FINISH_REASONS = {"eog": "stop", "stop": "stop", "max_tokens": "length", "prefill": "length",
                  "cancelled": "stop", "error": "stop"}


def finish_reason(engine_reason: str, tool_calls: bool = False) -> str:
    """The OpenAI ``finish_reason`` (``tool_calls`` when the answer called tools)."""
    if tool_calls and engine_reason in ("eog", "stop"):
        return "tool_calls"
    return FINISH_REASONS.get(str(engine_reason), "stop")


def total_usage(usages: Sequence[Usage]) -> Usage:
    """The usage of several generations of one request (choices, prompts), summed."""
    return Usage(sum(u.prompt_tokens for u in usages), sum(u.completion_tokens for u in usages),
                 sum(u.cached_tokens for u in usages))


def usage_dict(usage: Usage) -> dict[str, Any]:
    """OpenAI ``usage`` with ``prompt_tokens_details.cached_tokens``."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _per_token_ms(seconds: float, n: int) -> float:
    return seconds * 1000.0 / n if n > 0 and seconds > 0 else 0.0


def diverged_at(timings: RequestTimings) -> int | None:
    """First prompt token not served from cache, None when the whole prompt matched.

    Reuse stops one token short of the prompt (its logits are needed), so a match of
    ``prompt_tokens - 1`` is a full match.
    """
    if timings.prompt_tokens and timings.reused_tokens >= timings.prompt_tokens - 1:
        return None
    return timings.reused_tokens


def timings_dict(timings: RequestTimings, model: ModelInfo | None = None,
                 prompt_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """llama-server's ``timings`` plus the cache explanation."""
    at = diverged_at(timings)
    out: dict[str, Any] = {
        "prompt_n": timings.prefill_tokens,
        "prompt_ms": timings.prefill_s * 1000.0,
        "prompt_per_token_ms": _per_token_ms(timings.prefill_s, timings.prefill_tokens),
        "prompt_per_second": timings.prefill_tok_per_s or 0.0,
        "predicted_n": timings.completion_tokens,
        "predicted_ms": timings.decode_s * 1000.0,
        "predicted_per_token_ms": _per_token_ms(timings.decode_s,
                                                max(0, timings.completion_tokens - 1)),
        "predicted_per_second": timings.decode_tok_per_s or 0.0,
        "queued_ms": timings.queued_s * 1000.0,
        "cache_n": timings.reused_tokens,
        "cache_inflight_n": timings.inflight_tokens,
    }
    if timings.reused_tokens and timings.reuse_source:
        out["cache_source"] = timings.reuse_source
    if timings.checkpoint_tokens:  # a context checkpoint, and how far before the match
        out["cache_checkpoint_n"] = timings.checkpoint_tokens
        out["cache_checkpoint_behind"] = timings.checkpoint_behind
    if timings.ttft_s is not None:
        out["ttft_ms"] = timings.ttft_s * 1000.0
    if at is not None:
        out["cache_diverged_at"] = at
    if timings.draft_tokens:  # llama-server reports these only when the request drafted
        out["draft_n"] = timings.draft_tokens
        out["draft_n_accepted"] = timings.draft_accepted
    if model is not None and prompt_ids is not None and at and "cache_source" in out:
        window = [t for t in prompt_ids[at:at + DIVERGED_TEXT_TOKENS] if t >= 0]  # not media
        out["cache_diverged_text"] = model.detokenize(window, False, True) if window else ""
    return out


def progress_dict(event: ProgressEvent) -> dict[str, Any]:
    """llama-server's ``prompt_progress``: ``total`` prompt tokens, ``cache`` reused,
    ``processed`` so far (reused included), ``time_ms`` since prompt processing began."""
    return {"total": event.total, "cache": event.cache, "processed": event.processed,
            "time_ms": event.timings.prefill_s * 1000.0}


def per_token_timings(event: object, model: ModelInfo | None = None,
                      prompt_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """``{"timings": ...}`` for an event carrying the timings so far (``timings_per_token``,
    progress events), else ``{}``."""
    timings = getattr(event, "timings", None)
    return {} if timings is None else {"timings": timings_dict(timings, model, prompt_ids)}
