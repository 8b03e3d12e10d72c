"""Stream objects that submit their request at the first iteration (the lazy rule).

:class:`EventStream` (blocking) and :class:`AsyncEventStream` (asyncio) stand for one request
whose options were validated when the stream was made (invalid options raise there) but that
is **submitted at the first iteration** (or on entering ``with`` / ``async with``):

- a stream that is never iterated holds no slot and costs the engine nothing;
- a stream cancelled before that (:meth:`~EventStream.cancel`, or ``cancel(request_id)`` on the
  :class:`PendingStreams` its maker keeps) is never submitted: iterating it then ends at once
  (its own ``cancel``) or raises :class:`~llamapy.errors.RequestCancelledError` (a cancel by id,
  as for a submitted request);
- Python generators and vLLM's ``generate()`` behave so, and it is the only rule an async
  stream can follow when its prompt can only be tokenized after an awaited model load.

Submission has two phases: ``prepare()`` does the slow part (wait for the model, tokenize; it
may raise, and ends the stream then) and returns ``submit``, which makes the submitted
:class:`~llamapy.runtime.client.RequestStream` under the registry's lock, so a cancel by id
either finds the stream unsubmitted or reaches the engine after the request.

:class:`TextChunks` / :class:`AsyncTextChunks` read the text of such a stream. Every stream has
``request_id`` (known when it is made), ``cancel()``, and ``close()`` + ``with`` (sync) or
``aclose()`` + ``async with`` (async); leaving the block cancels a request still running.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

from llamapy.engine.request import StreamEvent, TokenEvent
from llamapy.errors import RequestCancelledError
from llamapy.runtime.client import AsyncRequestStream, RequestStream

__all__ = ["AsyncEventStream", "AsyncTextChunks", "EventStream", "PendingStreams",
           "TextChunks"]

S = TypeVar("S", RequestStream, AsyncRequestStream)


class _Lazy(Generic[S]):
    """What both lazy streams share: the request id, the flags, the submitted stream."""

    def __init__(self, request_id: Hashable, pending: PendingStreams | None) -> None:
        self.request_id = request_id
        self._pending = pending if pending is not None else PendingStreams()
        self._events: S | None = None
        self._cancelled = False  # by this stream's cancel(): iteration ends quietly
        self._revoked = False  # by a cancel of its id: iteration raises RequestCancelledError
        self._pending.add(self)

    @property
    def submitted(self) -> bool:
        """Whether the request was handed to the engine."""
        return self._events is not None

    def cancel(self) -> None:
        """Cancel the request (never submitted if it was not yet); idempotent."""
        self._cancelled = True
        self._pending.discard(self)
        if self._events is not None:
            self._events.cancel()

    def _finish(self, submit: Callable[[], S]) -> S | None:
        """Submit (the second phase) unless cancelled meanwhile."""
        events = self._pending.submit(self, submit)
        self._events = events
        return events

    def _unsubmittable(self) -> bool:
        """True when the stream must not submit (cancelled); raises when revoked."""
        if self._revoked:  # raised once; the stream has ended then
            self._revoked, self._cancelled = False, True
            raise RequestCancelledError(f"request {self.request_id!r} was cancelled")
        return self._cancelled


class PendingStreams:
    """The lazy streams one maker (a server) made and that were not submitted yet, by request
    id (weakly: a dropped stream leaves at once). :meth:`cancel` by id reaches them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: weakref.WeakValueDictionary[Hashable, _Lazy[Any]] = \
            weakref.WeakValueDictionary()

    def add(self, stream: _Lazy[S]) -> None:
        """Register a stream not submitted yet (the latest one of an id wins)."""
        with self._lock:
            self._streams[stream.request_id] = stream

    def discard(self, stream: _Lazy[S]) -> None:
        """Forget ``stream`` (cancelled or submitted)."""
        with self._lock:
            if self._streams.get(stream.request_id) is stream:
                del self._streams[stream.request_id]

    def cancel(self, request_id: Hashable) -> bool:
        """Cancel the unsubmitted stream of ``request_id``: it will never be submitted and
        its iteration raises :class:`~llamapy.errors.RequestCancelledError`. False if none."""
        with self._lock:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream._revoked = True
            return stream is not None

    def submit(self, stream: _Lazy[S], submit: Callable[[], S]) -> S | None:
        """``submit()`` under the lock unless ``stream`` was cancelled (None) or revoked
        (:class:`~llamapy.errors.RequestCancelledError`)."""
        with self._lock:
            if stream._unsubmittable():
                return None
            if self._streams.get(stream.request_id) is stream:
                del self._streams[stream.request_id]
            return submit()


class EventStream(_Lazy[RequestStream], Iterator[StreamEvent]):
    """A request's events for a blocking consumer, submitted at the first iteration or on
    entering ``with`` (see the module docstring). ``prepare()`` returns the submit call."""

    def __init__(self, request_id: Hashable,
                 prepare: Callable[[], Callable[[], RequestStream]],
                 pending: PendingStreams | None = None) -> None:
        super().__init__(request_id, pending)
        self._prepare = prepare

    def open(self) -> RequestStream | None:
        """Submit now if not yet (None when cancelled before); idempotent."""
        if self._events is not None or self._unsubmittable():
            return self._events
        try:
            return self._finish(self._prepare())
        except BaseException:
            self.cancel()
            raise

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> StreamEvent:
        events = self.open()
        if events is None:
            raise StopIteration
        return next(events)

    def close(self) -> None:
        """Cancel the request if it is still running (or was never submitted)."""
        self.cancel()

    def __enter__(self) -> EventStream:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class AsyncEventStream(_Lazy[AsyncRequestStream], AsyncIterator[StreamEvent]):
    """The asyncio :class:`EventStream`: ``prepare()`` is awaited (the model load, say)."""

    def __init__(self, request_id: Hashable,
                 prepare: Callable[[], Awaitable[Callable[[], AsyncRequestStream]]],
                 pending: PendingStreams | None = None) -> None:
        super().__init__(request_id, pending)
        self._prepare = prepare

    async def open(self) -> AsyncRequestStream | None:
        """Submit now if not yet (None when cancelled before); idempotent."""
        if self._events is not None or self._unsubmittable():
            return self._events
        try:
            return self._finish(await self._prepare())
        except BaseException:  # an error, or the awaiting task cancelled: nothing submitted
            self.cancel()
            raise

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> StreamEvent:
        events = await self.open()
        if events is None:
            raise StopAsyncIteration
        return await events.__anext__()

    async def aclose(self) -> None:
        """Cancel the request if it is still running (or was never submitted)."""
        self.cancel()

    async def __aenter__(self) -> AsyncEventStream:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class TextChunks(Iterator[str]):
    """The text of an :class:`EventStream`, chunk by chunk (empty chunks skipped).
    ``request_id``, :meth:`cancel`, :meth:`close` and ``with`` are the stream's."""

    def __init__(self, events: EventStream) -> None:
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
        """Cancel the request if it is still running (or was never submitted)."""
        self.events.cancel()

    close = cancel

    def __enter__(self) -> TextChunks:
        self.events.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class AsyncTextChunks(AsyncIterator[str]):
    """The async :class:`TextChunks` of an :class:`AsyncEventStream`."""

    def __init__(self, events: AsyncEventStream) -> None:
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
        """Cancel the request if it is still running (or was never submitted)."""
        self.events.cancel()

    async def aclose(self) -> None:
        """Cancel the request if it is still running (or was never submitted)."""
        self.events.cancel()

    async def __aenter__(self) -> AsyncTextChunks:
        await self.events.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()
