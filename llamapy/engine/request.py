"""Requests and the events the engine sends to their sinks.

A :class:`Request` is submitted to :meth:`Engine.submit`; the engine calls ``request.sink``
on its tick thread with zero or more :class:`TokenEvent` and then exactly one final event:
:class:`DoneEvent` (finish reasons ``eog``, ``max_tokens``, ``stop``, ``cancelled``,
``prefill``) or :class:`ErrorEvent` (finish reason ``error``). A sink that returns ``False``
(or raises) tells the engine its consumer went away: the request is cancelled; the final event
is still delivered (and its return value ignored).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from llamapy.engine.media import MediaRows, MediaSpan
from llamapy.engine.options import RequestOptions
from llamapy.engine.states import RequestState, StateMachine, request_machine
from llamapy.engine.text import TextStream
from llamapy.errors import LlamapyError

if TYPE_CHECKING:
    from llamapy.engine.backend import Sampler
    from llamapy.engine.slots import Slot
    from llamapy.engine.speculation.speculator import Speculation

__all__ = [
    "CacheKey",
    "DoneEvent",
    "ErrorEvent",
    "Event",
    "FinishReason",
    "Request",
    "RequestTimings",
    "Run",
    "Sink",
    "TokenEvent",
    "salt_digest",
]


class CacheKey(NamedTuple):
    """What KV is filed under: reuse (own slot, donor, RAM cache, disk, in-flight, n-gram
    drafts) needs equal keys.

    ``cache_scope`` is a trust boundary inside the tenant (None: the tenant's shared pool),
    ``cache_identity`` the model/manifest identity (opaque), ``adapter_set`` the LoRA set the
    KV was computed under, ``tenant`` the request's tenant (None: the default tenant: KV never
    crosses tenants) and ``salt`` the digest of the request's ``cache_salt``
    (:func:`salt_digest`; None: unsalted).
    """

    cache_scope: str | None = None
    cache_identity: str = ""
    adapter_set: tuple[Hashable, ...] = ()
    tenant: str | None = None
    salt: str | None = None

    @property
    def scope(self) -> tuple[str | None, str | None, str | None]:
        """``(tenant, cache_scope, salt)``: what a session's affinity is kept within."""
        return self.tenant, self.cache_scope, self.salt

    @property
    def display_scope(self) -> str | None:
        """The scope as shown to an admin: ``tenant/cache_scope`` (``tenant`` alone without a
        sub-scope; the plain ``cache_scope`` for the default tenant)."""
        if self.tenant is None:
            return self.cache_scope
        return self.tenant if self.cache_scope is None else f"{self.tenant}/{self.cache_scope}"


@lru_cache(maxsize=4096)
def salt_digest(salt: str | None) -> str | None:
    """The digest a :class:`CacheKey` keeps of a ``cache_salt`` (None for None): keys, stats
    and disk entries never hold the salt itself."""
    if salt is None:
        return None
    return hashlib.sha256(b"llamapy-cache-salt\x00" + salt.encode()).hexdigest()[:32]


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
    ``draft_tokens`` / ``draft_accepted`` count speculative draft tokens verified / accepted.
    ``slot_id`` is the slot the request ran on (-1 until it has one). ``pinned_tokens`` are
    prompt tokens this request computed and wrote to the prompt cache as part of a prefix its
    ``cache_pins`` asked to keep (0 when the pinned prefixes were cached already).
    ``checkpoint_tokens`` is the position of the context checkpoint the reuse restored (0:
    none) and ``checkpoint_behind`` how far it lay before the end of the shared prefix (those
    tokens were computed again).
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
    draft_tokens: int = 0
    draft_accepted: int = 0
    slot_id: int = -1
    pinned_tokens: int = 0
    checkpoint_tokens: int = 0
    checkpoint_behind: int = 0

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
    first, plus the sampled token's own pair at the end when it is not among them.
    ``slot_id`` is the slot that generated it."""

    request_id: Hashable
    token_id: int
    text: str
    logprobs: tuple[tuple[int, float], ...] | None = None
    timings: RequestTimings | None = None
    slot_id: int = -1


@dataclass(slots=True, frozen=True)
class DoneEvent:
    """Final event of a request that ended normally (or was cancelled)."""

    request_id: Hashable
    finish_reason: FinishReason
    completion_tokens: int
    prompt_tokens: int
    timings: RequestTimings
    stop_word: str = ""
    #: A pooled request's output (see :attr:`Request.pooled`); None for any other.
    pooled: tuple[float, ...] | None = None


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


@dataclass(slots=True, frozen=True)
class ProgressEvent:
    """Prompt processing progress of a request that asked for it (``return_progress``): one
    before its first prompt chunk is computed, then one after each chunk. ``total`` prompt
    tokens, ``cache`` of them reused, ``processed`` (reused included) computed so far."""

    request_id: Hashable
    total: int
    cache: int
    processed: int
    timings: RequestTimings


Event = TokenEvent | ProgressEvent | DoneEvent | ErrorEvent
#: What a consumer of a request's stream sees (an ``ErrorEvent`` raises instead).
StreamEvent = TokenEvent | ProgressEvent | DoneEvent
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
    equal :attr:`cache_key` (scope, identity, adapter set, tenant and salt). ``lease_id``
    runs the request on a leased slot (see :meth:`Engine.lease`). ``sampler``, when set, is
    the request's sampler built ahead (off the tick thread, by the backend's
    ``new_sampler``); the engine takes it over (and closes it) instead of building one.
    ``media`` places encoded images and audio in the prompt (see :mod:`llamapy.engine.media`):
    their rows' ids in ``token_ids`` are the chunks' media token ids. ``pooled``: the request
    asks for its prompt's pooled output (a reranker's scores, an embedding; the backend must
    pool, see :attr:`~llamapy.engine.backend.Backend.pools`), which its ``DoneEvent`` carries:
    its whole prompt is decoded in one batch, nothing is reused or kept, ``max_tokens`` is 0.
    ``checkpoint_hints``: prompt positions where a model whose state cannot be trimmed should
    keep a restore point (where the next turn's prompt is expected to diverge: the start of
    the generation prompt; see :mod:`llamapy.engine.cache.checkpoints`).
    """

    request_id: Hashable
    token_ids: Sequence[int]
    options: RequestOptions = field(default_factory=RequestOptions)
    sink: Sink = _null_sink
    cache_identity: str = ""
    lease_id: int | None = None
    sampler: Sampler | None = None
    media: tuple[MediaSpan, ...] = ()
    pooled: bool = False
    checkpoint_hints: tuple[int, ...] = ()

    @property
    def adapter_set(self) -> tuple[Hashable, ...]:
        """``options.adapters``: the adapter set every decode of this request runs under."""
        return self.options.adapters

    @property
    def cache_key(self) -> CacheKey:
        """``(cache_scope, cache_identity, adapter_set, tenant, salt)``: reuse requires equal
        keys."""
        options = self.options
        return CacheKey(options.cache_scope, self.cache_identity, options.adapters,
                        options.tenant, salt_digest(options.cache_salt))

    @property
    def affinity_key(self) -> Hashable | None:
        """What session affinity is keyed by: ``(scope, session)``, so one session string in
        two scopes or tenants names two conversations (None without a session)."""
        session = self.options.session
        return None if session is None else (self.cache_key.scope, session)


_RESOLVED = frozenset({RequestState.RUNNING, RequestState.ENDING})


@dataclass(slots=True, eq=False)
class Run:
    """A submitted :class:`Request` and everything the engine tracks about it while it is queued
    or on a slot (``prompt`` + generated = ``tokens``)."""

    request: Request
    serial: int
    cache_prompt: bool
    sampler: Sampler | None
    submitted_at: float
    prompt: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: TextStream = field(default_factory=TextStream)
    machine: StateMachine[RequestState] = field(default_factory=request_machine)
    timings: RequestTimings = field(default_factory=RequestTimings)
    slot: Slot | None = None
    admitted_at: float = 0.0
    prefill_started_at: float | None = None
    last_token_at: float | None = None
    finish: FinishReason | None = None
    error: LlamapyError | None = None
    spec: Speculation | None = None
    #: ``(length, ttl_s)`` of the pins still to write, shortest first (set when resolved).
    pins: list[tuple[int, float]] = field(default_factory=list)
    #: A pooled request's output, once its prompt is decoded.
    pooled: tuple[float, ...] | None = None
    #: Prompt positions its prefill still stops at to take a checkpoint (set when resolved).
    checkpoints_at: list[int] = field(default_factory=list)
    #: The request's :attr:`~Request.cache_key` (read for every token it decodes).
    key: CacheKey = field(init=False)

    def __post_init__(self) -> None:
        self.key = self.request.cache_key

    @property
    def request_id(self) -> Hashable:
        """The request's id."""
        return self.request.request_id

    @property
    def adapter_set(self) -> Hashable:
        """The adapter set every decode of this run uses."""
        return self.request.adapter_set

    @property
    def prefill_only(self) -> bool:
        """``max_tokens == 0``: compute the prompt's KV, sample nothing."""
        return self.request.options.max_tokens == 0

    @property
    def whole_prefill(self) -> bool:
        """Whether the prompt is decoded in one piece (a pooled request)."""
        return self.request.pooled

    @property
    def reuse_cap(self) -> int:
        """Most prompt tokens that may be reused: all but the last, whose logits are needed,
        unless nothing will be sampled."""
        return len(self.prompt) if self.prefill_only else max(0, len(self.prompt) - 1)

    def media_cut(self, start: int, end: int) -> tuple[int, MediaRows | None]:
        """A prefill chunk ``[start, end)`` cut so that it is all text or all one media
        chunk's rows: its new end, and the rows when it is media (all the rows of a chunk
        that is not causal, however short the chunk asked for)."""
        for span in self.request.media:
            if span.start <= start < span.end:
                stop = min(end, span.end) if span.chunk.causal else span.end
                return stop, MediaRows(span.chunk, start - span.start)
            if start < span.start:
                return min(end, span.start), None
        return end, None

    def chunk_to_pin(self, start: int, n: int) -> int:
        """``n`` prompt tokens from ``start``, cut to end at the next pin still to write (so
        the sequence holds exactly the pinned prefix once, to serialise), and at the next
        checkpoint still to take."""
        for length, _ in self.pins:
            if length > start:
                n = min(n, length - start)
                break
        for at in self.checkpoints_at:
            if at > start:
                return min(n, at - start)
        return n

    @property
    def num_generated(self) -> int:
        """Tokens sampled so far."""
        return len(self.tokens) - len(self.prompt)

    @property
    def state(self) -> RequestState:
        """Queued, resolving, running, ending or finished."""
        return self.machine.state

    @property
    def resolved(self) -> bool:
        """Whether the run's prefix reuse is applied on its slot (``RUNNING`` or ``ENDING``)."""
        return self.machine.state in _RESOLVED

    @property
    def ending(self) -> bool:
        """Whether the run's finish reason is known (state ``ENDING``; sent at the reap)."""
        return self.machine.state is RequestState.ENDING

    def end(self, reason: FinishReason, error: LlamapyError | None = None) -> None:
        """Mark the running run to finish with ``reason`` (and ``error``) at the tick's reap;
        ``IllegalTransitionError`` if it is not running."""
        self.machine.fire("end")
        self.finish = reason
        if error is not None:
            self.error = error

    def final_event(self, reason: FinishReason, error: LlamapyError | None = None) -> Event:
        """The run's one final event: ``ErrorEvent`` for ``FinishReason.ERROR``, else
        ``DoneEvent``."""
        if reason is FinishReason.ERROR:
            exc = error or LlamapyError("request failed")
            return ErrorEvent(self.request_id, exc, self.timings, self.num_generated)
        return DoneEvent(self.request_id, reason, self.num_generated, len(self.prompt),
                         self.timings, self.text.stop_word, self.pooled)
