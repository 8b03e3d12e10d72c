"""The one event client: how every caller above the engine submits a request and reads its
events (``Server``, ``Session`` and, through the server, the API adapters).

A :class:`RequestStream` (blocking) or :class:`AsyncRequestStream` (asyncio) submits one
request to a :class:`~llamapy.runtime.base.Runtime` when it is made, then yields its events:
the token events, then the final ``DoneEvent``; an ``ErrorEvent`` raises its typed error, a
cancelled ``DoneEvent`` raises :class:`~llamapy.errors.RequestCancelledError`. ``timeout``
bounds each wait (``per_event=True``) or the whole request (until ``deadline``, a
``time.monotonic()`` instant, when the call began before the stream was made). Running out of
time, closing the stream, cancelling the task that awaits it or garbage-collecting it cancels
the request on the engine.
``request_id`` is known at once, so any thread may ``runtime.cancel`` it. Request ids come from
one counter (:func:`new_request_id`).

These streams submit when they are made ("submit now"); the lazy stream objects that submit at
their first iteration are in :mod:`llamapy.runtime.streams`.
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
from llamapy.errors import RequestCancelledError, RequestTimeoutError
from llamapy.runtime.base import Runtime
from llamapy.runtime.handles import EventHandle

__all__ = ["AsyncRequestStream", "Collector", "Completion", "RequestStream", "Usage",
           "new_request_id", "raise_for"]

_ids = itertools.count(1)


def new_request_id() -> int:
    """A process-wide unique request id."""
    return next(_ids)


def raise_for(event: Event) -> None:
    """Raise the typed error of an ``ErrorEvent`` (a cancelled ``DoneEvent`` too)."""
    if isinstance(event, ErrorEvent):
        raise event.exc
    if isinstance(event, DoneEvent) and event.finish_reason is FinishReason.CANCELLED:
        raise RequestCancelledError(f"request {event.request_id!r} was cancelled")


class _Budget:
    """Seconds left for the next wait: per event, or one deadline for the whole request."""

    __slots__ = ("deadline", "timeout")

    def __init__(self, timeout: float | None, per_event: bool,
                 deadline: float | None = None) -> None:
        self.timeout = timeout
        if per_event or timeout is None:
            self.deadline = None
        else:
            self.deadline = time.monotonic() + timeout if deadline is None else deadline

    def left(self) -> float | None:
        if self.deadline is None:
            return self.timeout
        return max(0.0, self.deadline - time.monotonic())


class _Stream:
    """What the sync and async streams share: submission, the budget, the final event."""

    def __init__(self, runtime: Runtime, request: Request, handle: EventHandle,
                 timeout: float | None, per_event: bool, deadline: float | None) -> None:
        self._runtime = runtime
        self._handle = handle
        self._budget = _Budget(timeout, per_event, deadline)
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

    def revoke(self) -> None:
        """Ask the engine to cancel the request but keep reading: the consumer then sees
        :class:`~llamapy.errors.RequestCancelledError` (as after ``runtime.cancel``)."""
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
                 per_event: bool = True, deadline: float | None = None) -> None:
        super().__init__(runtime, request, runtime.open_handle(request.request_id), timeout,
                         per_event, deadline)

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
                 per_event: bool = True, deadline: float | None = None) -> None:
        loop = asyncio.get_running_loop()
        super().__init__(runtime, request, runtime.open_handle(request.request_id, loop),
                         timeout, per_event, deadline)

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
    """A finished request: its text with completion metadata.

    ``finish_reason`` is a :class:`~llamapy.engine.request.FinishReason` (a ``str`` enum: it
    compares equal to its value, and ``str()`` / formatting give the value). A completion
    carries one of:

    - ``"eog"``: the model produced an end-of-generation token;
    - ``"max_tokens"``: the token budget (``max_tokens``) or the context ran out;
    - ``"stop"``: a stop word or stop token matched (``stop_word`` names a stop word);
    - ``"prefill"``: ``max_tokens=0``: the prompt was only prefilled (cached), nothing was
      generated.

    A cancelled or failed request raises instead (``RequestCancelledError``, the typed error),
    so ``"cancelled"`` and ``"error"`` never reach a ``Completion``.
    """

    text: str
    completion_tokens: int
    finish_reason: FinishReason
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
            finish_reason=FinishReason(event.finish_reason), usage=usage, timings=event.timings,
            token_ids=tuple(self.token_ids), logprobs=tuple(self.logprobs),
            stop_word=event.stop_word,
        )
