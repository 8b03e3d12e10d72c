"""The one event client: how every caller above the engine submits a request and reads its
events (``Server``, ``Session`` and, through the server, the API adapters).

A :class:`RequestStream` (blocking) or :class:`AsyncRequestStream` (asyncio) submits one
request to a :class:`~llamapy.runtime.base.Runtime` when it is made, then yields its events:
the token events, then the final ``DoneEvent``; an ``ErrorEvent`` raises its typed error, a
cancelled ``DoneEvent`` raises :class:`~llamapy.errors.CancelledError`. ``timeout`` bounds
each wait (``per_event=True``) or the whole request. Running out of time, closing the stream,
cancelling the task that awaits it or garbage-collecting it cancels the request on the engine.
``request_id`` is known at once, so any thread may ``runtime.cancel`` it. Request ids come from
one counter (:func:`new_request_id`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Hashable, Iterator
from dataclasses import dataclass, field

from llamapy.engine.request import (
    DoneEvent,
    ErrorEvent,
    Event,
    FinishReason,
    Request,
    RequestTimings,
    StreamEvent,
    TokenEvent,
)
from llamapy.errors import CancelledError, RequestTimeoutError
from llamapy.runtime.base import Runtime
from llamapy.runtime.handles import EventHandle

__all__ = ["AsyncRequestStream", "AsyncTextChunks", "Collector", "Completion", "RequestStream",
           "TextChunks", "Usage", "new_request_id", "raise_for"]

_ids = itertools.count(1)


def new_request_id() -> int:
    """A process-wide unique request id."""
    return next(_ids)


def raise_for(event: Event) -> None:
    """Raise the typed error of an ``ErrorEvent`` (a cancelled ``DoneEvent`` too)."""
    if isinstance(event, ErrorEvent):
        raise event.exc
    if isinstance(event, DoneEvent) and event.finish_reason is FinishReason.CANCELLED:
        raise CancelledError(f"request {event.request_id!r} was cancelled")


class _Budget:
    """Seconds left for the next wait: per event, or one deadline for the whole request."""

    __slots__ = ("deadline", "timeout")

    def __init__(self, timeout: float | None, per_event: bool) -> None:
        self.timeout = timeout
        self.deadline = None if per_event or timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        if self.deadline is None:
            return self.timeout
        return max(0.0, self.deadline - time.monotonic())


class _Stream:
    """What the sync and async streams share: submission, the budget, the final event."""

    def __init__(self, runtime: Runtime, request: Request, handle: EventHandle,
                 timeout: float | None, per_event: bool) -> None:
        self._runtime = runtime
        self._handle = handle
        self._budget = _Budget(timeout, per_event)
        self.request_id: Hashable = request.request_id
        self.done = False
        self.final: DoneEvent | ErrorEvent | None = None
        request.sink = handle.sink
        runtime.submit(request)

    def cancel(self) -> None:
        """Cancel the request (if it has not ended) and stop reading; idempotent."""
        if not self.done:
            self.done = True
            self._handle.gone = True
            self._runtime.cancel(self.request_id)

    def _seen(self, event: Event) -> StreamEvent:
        if isinstance(event, DoneEvent | ErrorEvent):
            self.done = True
            self.final = event
            raise_for(event)
        assert not isinstance(event, ErrorEvent)
        return event

    def _expired(self) -> RequestTimeoutError:
        self.cancel()
        return RequestTimeoutError(f"request {self.request_id} timed out after "
                                   f"{self._budget.timeout} s")

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to cancel
            self.cancel()


class RequestStream(_Stream, Iterator[StreamEvent]):
    """A submitted request's events for a blocking consumer (see the module docstring)."""

    def __init__(self, runtime: Runtime, request: Request, timeout: float | None, *,
                 per_event: bool = True) -> None:
        super().__init__(runtime, request, runtime.open_handle(request.request_id), timeout,
                         per_event)

    def __iter__(self) -> RequestStream:
        return self

    def __next__(self) -> StreamEvent:
        if self.done:
            raise StopIteration
        try:
            event = self._handle.get(self._budget.left())
        except TimeoutError:
            raise self._expired() from None
        return self._seen(event)

    def close(self) -> None:
        """Cancel the request if it is still running."""
        self.cancel()

    def __enter__(self) -> RequestStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class AsyncRequestStream(_Stream, AsyncIterator[StreamEvent]):
    """A submitted request's events for an asyncio consumer (no thread per request)."""

    def __init__(self, runtime: Runtime, request: Request, timeout: float | None, *,
                 per_event: bool = True) -> None:
        loop = asyncio.get_running_loop()
        super().__init__(runtime, request, runtime.open_handle(request.request_id, loop),
                         timeout, per_event)

    def __aiter__(self) -> AsyncRequestStream:
        return self

    async def __anext__(self) -> StreamEvent:
        if self.done:
            raise StopAsyncIteration
        try:
            event = await self._handle.aget(self._budget.left())
        except TimeoutError:
            raise self._expired() from None
        except BaseException:  # the awaiting task was cancelled: so is the request
            self.cancel()
            raise
        return self._seen(event)

    async def aclose(self) -> None:
        """Cancel the request if it is still running."""
        self.cancel()

    async def __aenter__(self) -> AsyncRequestStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


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
    """A finished request: its text with completion metadata."""

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
    """Accumulates a request's events into a :class:`Completion`."""

    prompt_tokens: int
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)

    def add(self, event: Event) -> Completion | None:
        """Record one event; the completion once the final one arrives."""
        if isinstance(event, TokenEvent):
            self.text.append(event.text)
            self.token_ids.append(event.token_id)
            if event.logprobs is not None:
                self.logprobs.append(event.logprobs)
            return None
        if isinstance(event, DoneEvent):
            return self.finish(event)
        return None

    def finish(self, event: DoneEvent) -> Completion:
        """The completion once the request is done."""
        usage = Usage(event.prompt_tokens, event.completion_tokens, event.timings.reused_tokens)
        return Completion(
            text="".join(self.text), completion_tokens=event.completion_tokens,
            finish_reason=str(event.finish_reason), usage=usage, timings=event.timings,
            token_ids=tuple(self.token_ids), logprobs=tuple(self.logprobs),
            stop_word=event.stop_word,
        )


class TextChunks(Iterator[str]):
    """The text a :class:`RequestStream` releases, chunk by chunk (empty chunks skipped).
    ``request_id`` / :meth:`cancel` / :meth:`close` are the stream's."""

    def __init__(self, events: RequestStream) -> None:
        self.events = events
        self.request_id = events.request_id

    def __iter__(self) -> TextChunks:
        return self

    def __next__(self) -> str:
        for event in self.events:
            if isinstance(event, TokenEvent) and event.text:
                return event.text
        raise StopIteration

    def cancel(self) -> None:
        """Cancel the request if it is still running."""
        self.events.cancel()

    close = cancel


class AsyncTextChunks(AsyncIterator[str]):
    """The async :class:`TextChunks` of an :class:`AsyncRequestStream`."""

    def __init__(self, events: AsyncRequestStream) -> None:
        self.events = events
        self.request_id = events.request_id

    def __aiter__(self) -> AsyncTextChunks:
        return self

    async def __anext__(self) -> str:
        async for event in self.events:
            if isinstance(event, TokenEvent) and event.text:
                return event.text
        raise StopAsyncIteration

    def cancel(self) -> None:
        """Cancel the request if it is still running."""
        self.events.cancel()

    async def aclose(self) -> None:
        """Cancel the request if it is still running."""
        self.events.cancel()
