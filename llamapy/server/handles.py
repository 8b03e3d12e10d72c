"""Per-request consumers: a sink the tick thread feeds, read by a sync or an async caller.

The sink returns False once the consumer has gone away (stream closed, garbage-collected, task
cancelled), which tells the engine to cancel the request.
"""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field

from ..engine import DoneEvent, ErrorEvent, Event, FinishReason, RequestTimings, TokenEvent


@dataclass(slots=True, frozen=True)
class Usage:
    """Token accounting of one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True, frozen=True)
class Completion:
    """The result of :meth:`Server.complete_tokens` / :meth:`Server.complete`."""

    text: str
    completion_tokens: int
    finish_reason: str
    usage: Usage
    timings: RequestTimings
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    stop_word: str = ""


@dataclass(slots=True)
class Collector:
    """Accumulates events into a :class:`Completion`."""

    prompt_tokens: int
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)

    def add(self, event: TokenEvent) -> None:
        """Record one token event."""
        self.text.append(event.text)
        self.token_ids.append(event.token_id)
        if event.logprobs is not None:
            self.logprobs.append(event.logprobs)

    def finish(self, event: DoneEvent) -> Completion:
        """The completion once the request is done."""
        usage = Usage(event.prompt_tokens, event.completion_tokens, event.timings.reused_tokens)
        return Completion(
            text="".join(self.text), completion_tokens=event.completion_tokens,
            finish_reason=str(event.finish_reason), usage=usage, timings=event.timings,
            token_ids=tuple(self.token_ids), logprobs=tuple(self.logprobs),
            stop_word=event.stop_word,
        )


class SyncHandle:
    """Events of one request for a blocking consumer."""

    def __init__(self) -> None:
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.gone = False

    def sink(self, event: Event) -> bool:
        """Called on the tick thread."""
        self.events.put(event)
        return not self.gone

    def get(self, timeout: float | None) -> Event:
        """Next event; ``queue.Empty`` on timeout."""
        return self.events.get(timeout=timeout)


class AsyncHandle:
    """Events of one request for an asyncio consumer (no thread per request)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.gone = False

    def sink(self, event: Event) -> bool:
        """Called on the tick thread: hand the event to the consumer's loop."""
        if self.gone:
            return False
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the consumer's loop is closed
            self.gone = True
        return not self.gone

    async def get(self, timeout: float | None) -> Event:
        """Next event; ``TimeoutError`` on timeout.

        Not ``asyncio.wait_for``: before Python 3.12 it can swallow a cancellation that
        arrives together with an event, and a cancelled consumer must always cancel.
        """
        if timeout is None:
            return await self.events.get()
        getter = asyncio.ensure_future(self.events.get())
        try:
            done, _ = await asyncio.wait({getter}, timeout=timeout)
        finally:
            if not getter.done():
                getter.cancel()
        if getter not in done:
            raise TimeoutError
        return getter.result()


def is_final(event: Event) -> bool:
    """Whether ``event`` ends its request."""
    return isinstance(event, (DoneEvent, ErrorEvent))


def raise_for(event: Event) -> None:
    """Raise the typed error of an ``ErrorEvent`` (a cancelled ``DoneEvent`` too)."""
    if isinstance(event, ErrorEvent):
        raise event.exc
    if isinstance(event, DoneEvent) and event.finish_reason is FinishReason.CANCELLED:
        from ..errors import CancelledError

        raise CancelledError(f"request {event.request_id!r} was cancelled")
