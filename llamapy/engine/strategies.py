"""Batch strategies: how one tick's ``n_batch`` token budget is shared.

Every tick the engine builds a :class:`BatchView` (who is decoding, who is prefilling and how
much is left, the queue with waiting times and prompt sizes) and asks the strategy to
``allocate`` it. A decoding slot takes exactly one token; a prefilling slot takes up to
``min(chunk_size, remaining_prefill)``. The engine validates every :class:`BatchDecision`
(budget, chunk bound, known slots, progress) and raises ``InvalidOptionError`` on a violation.

``admission_order`` lets a strategy reorder the queue (shortest prompt first, deadlines...);
the engine still serves a freed slot to the queued request of that slot's session first, and
with requests of several tenants the order holds within each tenant while the tenants take
turns (:mod:`llamapy.engine.tenants`).

User strategies implement :class:`BatchStrategy` (or subclass :class:`BaseStrategy`) and are
passed as ``EngineConfig(batch_strategy=...)`` (an instance or a zero-argument class).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from llamapy.errors import InvalidOptionError

__all__ = [
    "Balanced",
    "BaseStrategy",
    "BatchDecision",
    "BatchStrategy",
    "BatchView",
    "DecodeMaximal",
    "PrefillPriority",
    "QueuedView",
    "ShortestFirst",
    "SlotView",
    "resolve_strategy",
    "strategy_names",
]


@dataclass(slots=True, frozen=True)
class SlotView:
    """A running slot as strategies see it (times are engine-clock seconds)."""

    slot_id: int
    request_id: Hashable
    prompt_tokens: int
    num_computed: int
    remaining_prefill: int
    num_generated: int
    submitted_at: float
    admitted_at: float
    last_token_at: float | None
    serial: int
    leased: bool = False
    #: Its prefill is decoded in one piece (a pooled request): all of it in one tick, or none.
    whole: bool = False


def admission_key(slot: SlotView) -> tuple[float, int]:
    """The order slots were admitted in (the order admission gave them, which already holds
    the strategy's ``admission_order`` and the tenants' turns; ties: submission order)."""
    return slot.admitted_at, slot.serial


@dataclass(slots=True, frozen=True)
class QueuedView:
    """A queued request as strategies see it."""

    request_id: Hashable
    prompt_tokens: int
    submitted_at: float
    serial: int
    session: Hashable | None = None
    lease_id: int | None = None
    #: Prompt tokens it could reuse if admitted now (an idle slot's cache or the RAM cache).
    cached_tokens: int = 0


@dataclass(slots=True, frozen=True)
class BatchView:
    """Everything a strategy may use to fill one tick.

    ``prefilling`` lists only slots that can prefill this tick (a slot waiting for another slot
    to compute a shared prefix is left out).
    """

    now: float
    n_batch: int
    chunk_size: int
    decoding: tuple[SlotView, ...]
    prefilling: tuple[SlotView, ...]
    queue: tuple[QueuedView, ...] = ()
    #: Prefill tokens that cost as much as one decode pass's fixed cost (``a / b`` of the
    #: engine's learned ``seconds = a + b * tokens``; 0 until it has learned it).
    pass_tokens: float = 0.0

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot."""
        return len(self.queue)

    def chunk_for(self, slot: SlotView) -> int:
        """The most prefill tokens ``slot`` may take this tick (for a ``whole`` slot: exactly
        these or none)."""
        if slot.whole:
            return slot.remaining_prefill
        return min(self.chunk_size, slot.remaining_prefill)


@dataclass(slots=True)
class BatchDecision:
    """Slots that decode their next token, and prefill tokens per slot."""

    decode: list[int] = field(default_factory=list)
    prefill: dict[int, int] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        """Tokens this decision puts in the batch."""
        return len(self.decode) + sum(self.prefill.values())


@runtime_checkable
class BatchStrategy(Protocol):
    """A batch-building policy. ``allocate`` is required; ``admission_order`` returns indices
    into ``queue`` in the order requests should get free slots (default FIFO)."""

    name: str

    def allocate(self, view: BatchView) -> BatchDecision: ...

    def admission_order(self, queue: Sequence[QueuedView], now: float) -> Sequence[int]: ...


class BaseStrategy:
    """Helpers shared by the built-in strategies; cache-aware FIFO admission."""

    name = "base"
    #: A queued request that has waited this long is admitted before warmer ones.
    warm_first_max_wait_s = 2.0

    def allocate(self, view: BatchView) -> BatchDecision:  # pragma: no cover - abstract
        raise NotImplementedError

    def admission_order(self, queue: Sequence[QueuedView], now: float) -> Sequence[int]:
        """Cache-aware FIFO. Requests that can reuse a cached prefix now (``cached_tokens``)
        go before cold ones, so a conversation's next turn is not pushed out of its cache by a
        cold request that happened to arrive first; a request that has waited
        ``warm_first_max_wait_s`` goes first whatever its cache, so none starves. Submission
        order within each group."""
        overdue, warm, cold = [], [], []
        for i, q in enumerate(queue):
            if now - q.submitted_at >= self.warm_first_max_wait_s:
                overdue.append(i)
            elif q.cached_tokens > 0:
                warm.append(i)
            else:
                cold.append(i)
        return overdue + warm + cold

    @staticmethod
    def decoders_by_wait(view: BatchView) -> list[SlotView]:
        """Decoding slots, the one that waited longest for a token first."""
        return sorted(view.decoding, key=lambda s: (s.last_token_at or 0.0, s.serial))

    @staticmethod
    def fill_prefill(view: BatchView, budget: int, decision: BatchDecision,
                     order: Sequence[SlotView] | None = None) -> int:
        """Give prefilling slots tokens in ``order`` (default: admission order) until
        ``budget`` is spent (a ``whole`` slot that does not fit what is left is passed over);
        returns what is left of it."""
        for slot in sorted(view.prefilling, key=admission_key) if order is None else order:
            n = min(budget, view.chunk_for(slot))
            if n <= 0:
                break
            if slot.whole and n < slot.remaining_prefill:
                continue
            decision.prefill[slot.slot_id] = n
            budget -= n
        return budget


class DecodeMaximal(BaseStrategy):
    """Every decoding slot gets its token; prefill chunks, up to ``chunk_size`` per slot, fill
    the rest of ``n_batch`` in admission order (FIFO)."""

    name = "decode_maximal"

    def allocate(self, view: BatchView) -> BatchDecision:
        decision = BatchDecision()
        decoders = self.decoders_by_wait(view)[: view.n_batch]
        decision.decode = [s.slot_id for s in decoders]
        self.fill_prefill(view, view.n_batch - len(decoders), decision)
        return decision


class PrefillPriority(BaseStrategy):
    """Prefill chunks first (best time to first token); decoding slots get what is left."""

    name = "prefill_priority"

    def allocate(self, view: BatchView) -> BatchDecision:
        decision = BatchDecision()
        budget = self.fill_prefill(view, view.n_batch, decision)
        decision.decode = [s.slot_id for s in self.decoders_by_wait(view)[:budget]]
        return decision


class Balanced(BaseStrategy):
    """Smooth streaming under mixed load.

    Decoding slots always get their token. While any slot decodes, prefill is capped at
    ``prefill_share`` of ``n_batch`` per tick (so a long prompt cannot stretch the inter-token
    delay of running streams) and shared evenly, round-robin, between prefilling slots instead
    of FIFO. With nobody decoding, prefill takes the whole budget.
    """

    name = "balanced"

    def __init__(self, prefill_share: float = 0.25) -> None:
        if not 0.0 < prefill_share <= 1.0:
            raise InvalidOptionError("Balanced.prefill_share must be in (0, 1]",
                                     option="batch_strategy")
        self.prefill_share = prefill_share

    def allocate(self, view: BatchView) -> BatchDecision:
        decision = BatchDecision()
        decoders = self.decoders_by_wait(view)[: view.n_batch]
        decision.decode = [s.slot_id for s in decoders]
        budget = view.n_batch - len(decoders)
        if decoders:
            budget = min(budget, max(1, int(view.n_batch * self.prefill_share)))
        self._share_evenly(view, budget, decision)
        return decision

    @staticmethod
    def _share_evenly(view: BatchView, budget: int, decision: BatchDecision) -> None:
        """``whole`` slots first, each all of it where it fits (admission order); the rest
        shared round-robin."""
        ordered = sorted(view.prefilling, key=admission_key)
        for slot in ordered:
            if slot.whole and slot.remaining_prefill <= budget:
                decision.prefill[slot.slot_id] = slot.remaining_prefill
                budget -= slot.remaining_prefill
        wants = {s.slot_id: view.chunk_for(s) for s in ordered if not s.whole}
        while budget > 0 and wants:
            share = max(1, budget // len(wants))
            for slot_id in list(wants):
                n = min(share, wants[slot_id], budget)
                decision.prefill[slot_id] = decision.prefill.get(slot_id, 0) + n
                wants[slot_id] -= n
                budget -= n
                if wants[slot_id] == 0:
                    del wants[slot_id]
                if budget == 0:
                    break


class ShortestFirst(BaseStrategy):
    """Default. Time to first token: the shortest remaining prefill first, one prefill
    finished per tick.

    Decoding slots always get their token (a stream waits one tick at most). Prefill takes at
    most ``chunk_size`` tokens a tick, given to prefilling slots in order of remaining prefill,
    shortest first, so a request that needs 100 tokens gets its first token after a 100-token
    tick instead of after everyone's prefill together. Once a tick finishes one request's
    prefill, another prefill joins it only when it finishes too and costs less than the pass
    it saves the requests still waiting (``pass_tokens`` each): every other prefill token
    would delay the first token of the request that finishes, and only move the later
    requests' work, not shorten it. Admission likewise takes the request with the fewest
    tokens left to compute (its prompt less what it can reuse from the caches) first.
    Prefills decoded whole (pooled requests) are packed as many as fit: their callers wait
    for all of them.

    No request starves: a slot prefilling for ``max_wait_s`` since its admission, and a
    request queued for ``max_wait_s``, goes before all others, oldest first. A prefilling slot
    therefore gets tokens within ``max_wait_s`` plus the prefill of the at most ``n_parallel -
    1`` slots admitted before it.
    """

    name = "shortest_first"

    def __init__(self, max_wait_s: float = 2.0) -> None:
        if not (isinstance(max_wait_s, (int, float)) and 0.0 <= max_wait_s < float("inf")):
            raise InvalidOptionError("ShortestFirst.max_wait_s must be a finite number >= 0",
                                     option="batch_strategy")
        self.max_wait_s = float(max_wait_s)
        self.warm_first_max_wait_s = self.max_wait_s

    def allocate(self, view: BatchView) -> BatchDecision:
        decision = BatchDecision()
        decoders = self.decoders_by_wait(view)[: view.n_batch]
        decision.decode = [s.slot_id for s in decoders]
        order = sorted(view.prefilling, key=lambda s: self._prefill_key(s, view.now))
        budget = min(view.n_batch - len(decoders), view.chunk_size)
        if any(s.whole for s in order):
            self.fill_prefill(view, budget, decision, order)
        else:
            self._one_at_a_time(view, budget, decision, order)
        return decision

    @staticmethod
    def _one_at_a_time(view: BatchView, budget: int, decision: BatchDecision,
                       order: Sequence[SlotView]) -> None:
        """Prefill in ``order`` until one prefill finishes; after it, only prefills that
        finish within the budget and cost less than the passes they save the others."""
        finished = False
        for slot in order:
            n = min(budget, view.chunk_for(slot))
            if n <= 0:
                return
            if finished and (n < slot.remaining_prefill
                             or n > view.pass_tokens * (len(order) - 1)):
                continue
            decision.prefill[slot.slot_id] = n
            budget -= n
            finished = n == slot.remaining_prefill
            if not finished:
                return

    def admission_order(self, queue: Sequence[QueuedView], now: float) -> Sequence[int]:
        """Requests queued ``max_wait_s`` first (oldest first), then the fewest tokens left to
        compute (prompt less cached) first; submission order breaks ties."""
        def key(i: int) -> tuple[bool, float, int]:
            q = queue[i]
            if now - q.submitted_at >= self.max_wait_s:
                return False, q.submitted_at, q.serial
            return True, float(max(0, q.prompt_tokens - q.cached_tokens)), q.serial

        return sorted(range(len(queue)), key=key)

    def _prefill_key(self, slot: SlotView, now: float) -> tuple[bool, float, float, int]:
        if now - slot.admitted_at >= self.max_wait_s:
            return False, 0.0, slot.admitted_at, slot.serial
        return True, float(slot.remaining_prefill), slot.admitted_at, slot.serial


_BUILTIN: dict[str, type[BaseStrategy]] = {
    cls.name: cls for cls in (DecodeMaximal, PrefillPriority, Balanced, ShortestFirst)
}
_ALIASES = {cls.__name__: cls.name for cls in _BUILTIN.values()}


def decodes_every_slot(strategy: BatchStrategy) -> bool:
    """Whether ``strategy`` is a built-in one, which with no slot prefilling decodes every
    decoding slot, the longest waiting first (the engine then skips building its view)."""
    return type(strategy) in _BUILTIN.values()


def strategy_names() -> tuple[str, ...]:
    """Names accepted for the built-in strategies."""
    return tuple(_BUILTIN)


def resolve_strategy(spec: object) -> BatchStrategy:
    """A strategy instance from a name, a class or an instance; ``InvalidOptionError`` if
    ``spec`` is none of those or lacks a callable ``allocate``."""
    if isinstance(spec, str):
        name = _ALIASES.get(spec, spec)
        if name not in _BUILTIN:
            raise InvalidOptionError(
                f"unknown batch_strategy {spec!r}; valid: {', '.join(strategy_names())}",
                option="batch_strategy",
            )
        return _BUILTIN[name]()
    if isinstance(spec, type):
        cls = spec
        try:
            spec = cls()
        except TypeError as exc:
            raise InvalidOptionError(f"batch_strategy class {cls.__name__} needs no-arg "
                                     f"construction: {exc}", option="batch_strategy") from exc
    if not callable(getattr(spec, "allocate", None)):
        raise InvalidOptionError(f"batch_strategy {spec!r} has no allocate(view) method",
                                 option="batch_strategy")
    return spec  # type: ignore[return-value]
