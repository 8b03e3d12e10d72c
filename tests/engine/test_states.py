"""The slot and request state machines: table-driven, illegal transitions raise."""

from __future__ import annotations

import pytest

from llamapy.engine.states import (
    REQUEST_TRANSITIONS,
    SLOT_TRANSITIONS,
    RequestState,
    SlotState,
    StateMachine,
    request_machine,
    slot_machine,
)
from llamapy.errors import IllegalTransitionError

EVENTS = sorted({event for _, event in SLOT_TRANSITIONS})
ILLEGAL = [(s, e) for s in SlotState for e in EVENTS if (s, e) not in SLOT_TRANSITIONS]


@pytest.mark.parametrize(("start", "event"), sorted(SLOT_TRANSITIONS, key=str))
def test_every_slot_transition_in_the_table(start, event):
    machine = StateMachine("slot", SLOT_TRANSITIONS, start)
    assert machine.can(event)
    assert machine.fire(event) is SLOT_TRANSITIONS[(start, event)]


@pytest.mark.parametrize(("start", "event"), ILLEGAL)
def test_illegal_slot_transitions_raise_and_change_nothing(start, event):
    machine = StateMachine("slot", SLOT_TRANSITIONS, start)
    with pytest.raises(IllegalTransitionError) as info:
        machine.fire(event)
    assert machine.state is start
    assert (info.value.state, info.value.event) == (start, event)


def test_slot_lifecycle():
    m = slot_machine()
    assert m.state is SlotState.IDLE
    for event, state in [("assign", SlotState.PREFILLING), ("prefilled", SlotState.DECODING),
                         ("finish", SlotState.IDLE), ("lease", SlotState.LEASED),
                         ("assign", SlotState.PREFILLING), ("finish_leased", SlotState.LEASED),
                         ("release", SlotState.IDLE)]:
        assert m.fire(event) is state


def test_request_lifecycle_and_finished_is_terminal():
    m = request_machine()
    assert m.fire("admit") is RequestState.RESOLVING
    assert m.fire("resolve") is RequestState.RUNNING
    assert m.fire("end") is RequestState.ENDING
    with pytest.raises(IllegalTransitionError):
        m.fire("end")  # one finish reason
    assert m.fire("finish") is RequestState.FINISHED
    for event in {e for _, e in REQUEST_TRANSITIONS}:
        with pytest.raises(IllegalTransitionError):
            m.fire(event)
    assert m.state is RequestState.FINISHED


def test_queued_request_can_finish_without_running():
    m = request_machine()
    assert m.fire("finish") is RequestState.FINISHED


def test_a_request_placed_on_a_slot_can_finish_before_its_reuse_is_resolved():
    m = request_machine()
    m.fire("admit")
    with pytest.raises(IllegalTransitionError):
        m.fire("admit")
    assert m.fire("finish") is RequestState.FINISHED
