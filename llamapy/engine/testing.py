"""Helpers for driving an :class:`~llamapy.engine.engine.Engine` in tests and simulations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llamapy.engine.engine import Engine
from llamapy.engine.request import DoneEvent, ErrorEvent, Event, TokenEvent

__all__ = ["CrashingEngine", "Recorder", "drain"]


@dataclass(slots=True, eq=False)
class Recorder:
    """A sink that records a request's events; set ``gone`` to make it report its consumer
    went away. Raises ``AssertionError`` on any event after the final one."""

    gone: bool = False
    events: list[Event] = field(default_factory=list)
    on_event: Callable[[Event], None] | None = None

    def __call__(self, event: Event) -> bool:
        if self.final is not None:
            raise AssertionError(f"event {event!r} after final event {self.final!r}")
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)
        return not self.gone

    @property
    def tokens(self) -> list[int]:
        """Token ids received."""
        return [e.token_id for e in self.events if isinstance(e, TokenEvent)]

    @property
    def text(self) -> str:
        """Text received."""
        return "".join(e.text for e in self.events if isinstance(e, TokenEvent))

    @property
    def final(self) -> DoneEvent | ErrorEvent | None:
        """The final event, if any."""
        last = self.events[-1] if self.events else None
        return last if isinstance(last, DoneEvent | ErrorEvent) else None

    @property
    def finish_reason(self) -> str | None:
        """The final event's finish reason as a string."""
        final = self.final
        return None if final is None else str(final.finish_reason)


def drain(engine: object, max_ticks: int = 1_000_000,
          each: Callable[[], None] | None = None) -> int:
    """Tick ``engine`` until it has no work; returns the ticks taken. ``each`` runs after every
    tick (e.g. integrity checks). ``RuntimeError`` if it does not become idle."""
    for n in range(max_ticks):
        if not engine.tick():  # type: ignore[attr-defined]
            return n
        if each is not None:
            each()
    raise RuntimeError(f"engine still busy after {max_ticks} ticks")


class CrashingEngine(Engine):
    """An engine whose :meth:`tick` raises once ``armed`` is set: a bug no request should
    reach, for testing what a runtime does when its thread dies anyway."""

    armed = False

    def tick(self, keep_going: Callable[[], bool] = lambda: True) -> bool:
        """Raise ``RuntimeError("bug in tick")`` once armed, else tick."""
        if self.armed:
            raise RuntimeError("bug in tick")
        return super().tick(keep_going)
