"""The engine's state machines: one table each, illegal transitions raise and change nothing.

Slot::

    IDLE --lease--> LEASED --release--> IDLE
    IDLE --assign--> PREFILLING        LEASED --assign--> PREFILLING
    PREFILLING --prefilled--> DECODING
    PREFILLING | DECODING --finish--> IDLE          (slot not leased)
    PREFILLING | DECODING --finish_leased--> LEASED (slot leased)

Request::

    QUEUED --admit--> RESOLVING --resolve--> RUNNING --end--> ENDING --finish--> FINISHED
    QUEUED | RESOLVING | RUNNING --finish--> FINISHED   (cancelled, rejected, engine closed)

RESOLVING: placed on a slot, its prefix reuse not applied yet (the best source may be a disk
entry still being read); RUNNING: the slot holds the reused prefix, prefill and decode follow;
ENDING: its finish reason is known (a stop, an error, a cancel seen mid-tick), its final event
is sent by the tick's reap.
"""

from __future__ import annotations

from enum import Enum
from typing import Generic, TypeVar

from llamapy.errors import IllegalTransitionError

__all__ = [
    "FREE_SLOT_STATES",
    "REQUEST_TRANSITIONS",
    "RUNNING_SLOT_STATES",
    "SLOT_TRANSITIONS",
    "RequestState",
    "SlotState",
    "StateMachine",
]


class SlotState(Enum):
    """What a slot (one KV sequence) is doing."""

    IDLE = "idle"
    LEASED = "leased"
    PREFILLING = "prefilling"
    DECODING = "decoding"

    # Members are singletons compared by identity: hash them by identity too (Enum's own
    # __hash__ is Python code, run several times a tick by the state tables and sets).
    __hash__ = object.__hash__


class RequestState(Enum):
    """Where a request is: the queue, a slot (reuse being resolved, then running), or done
    (its final event sent)."""

    QUEUED = "queued"
    RESOLVING = "resolving"
    RUNNING = "running"
    ENDING = "ending"
    FINISHED = "finished"

    __hash__ = object.__hash__  # as SlotState's


#: Slots without a running request.
FREE_SLOT_STATES = frozenset({SlotState.IDLE, SlotState.LEASED})
#: Slots with a running request.
RUNNING_SLOT_STATES = frozenset({SlotState.PREFILLING, SlotState.DECODING})

SLOT_TRANSITIONS: dict[tuple[SlotState, str], SlotState] = {
    (SlotState.IDLE, "lease"): SlotState.LEASED,
    (SlotState.LEASED, "release"): SlotState.IDLE,
    (SlotState.IDLE, "assign"): SlotState.PREFILLING,
    (SlotState.LEASED, "assign"): SlotState.PREFILLING,
    (SlotState.PREFILLING, "prefilled"): SlotState.DECODING,
    (SlotState.PREFILLING, "finish"): SlotState.IDLE,
    (SlotState.DECODING, "finish"): SlotState.IDLE,
    (SlotState.PREFILLING, "finish_leased"): SlotState.LEASED,
    (SlotState.DECODING, "finish_leased"): SlotState.LEASED,
}

REQUEST_TRANSITIONS: dict[tuple[RequestState, str], RequestState] = {
    (RequestState.QUEUED, "admit"): RequestState.RESOLVING,
    (RequestState.RESOLVING, "resolve"): RequestState.RUNNING,
    (RequestState.QUEUED, "finish"): RequestState.FINISHED,
    (RequestState.RESOLVING, "finish"): RequestState.FINISHED,
    (RequestState.RUNNING, "end"): RequestState.ENDING,
    (RequestState.RUNNING, "finish"): RequestState.FINISHED,
    (RequestState.ENDING, "finish"): RequestState.FINISHED,
}

S = TypeVar("S", bound=Enum)


class StateMachine(Generic[S]):
    """A current state plus the table it may move by."""

    __slots__ = ("_machine", "_table", "state")

    def __init__(self, machine: str, table: dict[tuple[S, str], S], initial: S) -> None:
        self._machine = machine
        self._table = table
        #: The current state: read it, move it only with :meth:`fire` (a plain attribute, as
        #: the engine reads every slot's state several times a tick).
        self.state = initial

    def can(self, event: str) -> bool:
        """Whether ``event`` is legal now."""
        return (self.state, event) in self._table

    def fire(self, event: str) -> S:
        """Move by ``event``; ``IllegalTransitionError`` (state unchanged) if not allowed."""
        target = self._table.get((self.state, event))
        if target is None:
            raise IllegalTransitionError(self._machine, self.state, event)
        self.state = target
        return target

    def __repr__(self) -> str:
        return f"<{self._machine} {self.state.name}>"


def slot_machine() -> StateMachine[SlotState]:
    """A slot machine starting IDLE."""
    return StateMachine("slot", SLOT_TRANSITIONS, SlotState.IDLE)


def request_machine() -> StateMachine[RequestState]:
    """A request machine starting QUEUED."""
    return StateMachine("request", REQUEST_TRANSITIONS, RequestState.QUEUED)
