"""Requests and the events the engine sends to their sinks.

A :class:`Request` is submitted to :meth:`Engine.submit`; the engine calls ``request.sink``
on its tick thread with zero or more :class:`TokenEvent` and then exactly one final event:
:class:`DoneEvent` (finish reasons ``eog``, ``max_tokens``, ``stop``, ``cancelled``,
``prefill``) or :class:`ErrorEvent` (finish reason ``error``). A sink that returns ``False``
(or raises) tells the engine its consumer went away: the request is cancelled; the final event
is still delivered (and its return value ignored).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

from llamapy.engine.options import RequestOptions
from llamapy.errors import LlamapyError

__all__ = [
    "DoneEvent",
    "ErrorEvent",
    "Event",
    "FinishReason",
    "Request",
    "RequestTimings",
    "Sink",
    "TokenEvent",
]


class FinishReason(str, Enum):
    """Why a request ended. Compares equal to its string value."""

    EOG = "eog"
    MAX_TOKENS = "max_tokens"
    STOP = "stop"
    CANCELLED = "cancelled"
    ERROR = "error"
    PREFILL = "prefill"

    def __str__(self) -> str:
        return self.value


@dataclass(slots=True)
class RequestTimings:
    """Per-request measurements (seconds on the engine clock; rates in tokens/s).

    ``reused_tokens`` is the prompt prefix whose KV was reused; ``reuse_source`` names where the
    biggest part came from (``"own"``, ``"donor"``, ``"ram"``, ``"inflight"`` or ``None``);
    ``inflight_tokens`` were adopted from another slot computing the same prefix right now.
    """

    submitted_at: float = 0.0
    queued_s: float = 0.0
    ttft_s: float | None = None
    prompt_tokens: int = 0
    reused_tokens: int = 0
    reuse_source: str | None = None
    inflight_tokens: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    completion_tokens: int = 0
    decode_s: float = 0.0
    finish_reason: str | None = None

    @property
    def prefill_tok_per_s(self) -> float | None:
        """Prompt tokens computed per second of prefill, None if unmeasured."""
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else None

    @property
    def decode_tok_per_s(self) -> float | None:
        """Generated tokens (after the first) per second of decoding, None if unmeasured."""
        n = self.completion_tokens - 1
        return n / self.decode_s if self.decode_s > 0 and n > 0 else None

    def as_dict(self) -> dict[str, object]:
        """A plain dict, rates included."""
        out = asdict(self)
        out["prefill_tok_per_s"] = self.prefill_tok_per_s
        out["decode_tok_per_s"] = self.decode_tok_per_s
        return out


@dataclass(slots=True, frozen=True)
class TokenEvent:
    """One generated token. ``text`` is the newly complete UTF-8 text it released (possibly
    "", e.g. half a character, a possible stop-string prefix, or an EOG token).
    ``logprobs`` holds ``n_probs`` ``(token_id, logprob)`` pairs when asked for, most likely
    first, plus the sampled token's own pair at the end when it is not among them."""

    request_id: Hashable
    token_id: int
    text: str
    logprobs: tuple[tuple[int, float], ...] | None = None


@dataclass(slots=True, frozen=True)
class DoneEvent:
    """Final event of a request that ended normally (or was cancelled)."""

    request_id: Hashable
    finish_reason: FinishReason
    completion_tokens: int
    prompt_tokens: int
    timings: RequestTimings
    stop_word: str = ""


@dataclass(slots=True, frozen=True)
class ErrorEvent:
    """Final event of a request that failed; ``exc`` is a typed llamapy error."""

    request_id: Hashable
    exc: LlamapyError
    timings: RequestTimings
    completion_tokens: int = 0

    @property
    def finish_reason(self) -> FinishReason:
        """Always ``FinishReason.ERROR``."""
        return FinishReason.ERROR


Event = TokenEvent | DoneEvent | ErrorEvent
#: Called on the tick thread; returning False means the consumer is gone (cancel).
Sink = Callable[[Event], "bool | None"]


def _null_sink(event: Event) -> None:
    return None


@dataclass(slots=True, eq=False)
class Request:
    """A generation request.

    ``token_ids`` is the prompt (for a leased slot: the whole intended resident sequence).
    ``options`` are resolved (see :func:`~llamapy.engine.options.resolve_request_options`).
    ``cache_identity`` is an opaque key (model / manifest identity): KV is reused only between
    equal :attr:`cache_key` ``(options.cache_scope, cache_identity, adapter_set)``. ``lease_id``
    runs the request on a leased slot (see :meth:`Engine.lease`).
    """

    request_id: Hashable
    token_ids: Sequence[int]
    options: RequestOptions = field(default_factory=RequestOptions)
    sink: Sink = _null_sink
    cache_identity: str = ""
    lease_id: int | None = None

    @property
    def adapter_set(self) -> tuple[Hashable, ...]:
        """``options.adapters``: the adapter set every decode of this request runs under."""
        return self.options.adapters

    @property
    def cache_key(self) -> tuple[str | None, str, tuple[Hashable, ...]]:
        """``(cache_scope, cache_identity, adapter_set)``: reuse requires equal keys."""
        return (self.options.cache_scope, self.cache_identity, self.options.adapters)
