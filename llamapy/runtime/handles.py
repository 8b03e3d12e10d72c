"""Event handles: the buffer between an engine's sink (on the engine's thread) and one consumer.

A handle's :meth:`sink` is the request's sink. It returns False once the consumer is gone
(stream closed, garbage-collected, task cancelled) or has stopped reading (more than
``limit`` events unread), which tells the engine to cancel the request; the final event is
always buffered. ``get`` / ``aget`` wait for the next event and raise ``TimeoutError``.

- :class:`SyncHandle`: a blocking consumer of a threaded runtime.
- :class:`AsyncHandle`: an asyncio consumer of a threaded runtime (no thread per request).
  Events for every handle read on one event loop go through that loop's mailbox: the engine's
  thread appends, and wakes the loop (``call_soon_threadsafe``, a syscall) only when no wakeup
  is pending, so a tick's events for 16 streams cost one wakeup, not 16.
- :class:`InlineHandle`: a consumer of an engine driven in the consumer's own thread; waiting
  ticks the engine until the request has an event.
"""

from __future__ import annotations

import asyncio
import queue
import weakref
from collections import deque
from collections.abc import Hashable
from typing import Protocol

from llamapy.engine.engine import Engine
from llamapy.engine.request import DoneEvent, ErrorEvent, Event

__all__ = ["MAX_BUFFERED_EVENTS", "AsyncHandle", "EventHandle", "InlineHandle", "SyncHandle",
           "is_final"]

#: Unread events after which a request's consumer counts as gone (the request is cancelled).
MAX_BUFFERED_EVENTS = 4096


def is_final(event: Event) -> bool:
    """Whether ``event`` ends its request."""
    return isinstance(event, DoneEvent | ErrorEvent)


class EventHandle(Protocol):
    """What a request stream reads from (see the module docstring)."""

    request_id: Hashable
    gone: bool

    def sink(self, event: Event) -> bool: ...

    def get(self, timeout: float | None) -> Event: ...

    async def aget(self, timeout: float | None) -> Event: ...


class SyncHandle:
    """Events of one request for a blocking consumer."""

    __slots__ = ("_events", "gone", "limit", "request_id")

    def __init__(self, request_id: Hashable, limit: int = MAX_BUFFERED_EVENTS) -> None:
        self.request_id = request_id
        self.limit = limit
        self.gone = False
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()

    def sink(self, event: Event) -> bool:
        """Called on the engine's thread."""
        if self.gone:
            return False
        self._events.put(event)
        return self._events.qsize() <= self.limit

    def get(self, timeout: float | None) -> Event:
        """The next event; ``TimeoutError`` past ``timeout`` seconds."""
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None

    async def aget(self, timeout: float | None) -> Event:
        """Not for asyncio consumers (they get an :class:`AsyncHandle`)."""
        raise TypeError("SyncHandle is read with get()")


class _Mailbox:
    """Events bound for the handles of one event loop, delivered in batches.

    ``post`` runs on the engine's thread, ``_deliver`` on the loop. ``_deliver`` clears
    ``scheduled`` *before* it drains, so an event posted at any moment is either drained by
    the running delivery or schedules the next one: none is ever stranded.
    """

    __slots__ = ("__weakref__", "items", "loop", "scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: deque[tuple[AsyncHandle, Event]] = deque()
        self.scheduled = False

    def post(self, handle: AsyncHandle, event: Event) -> bool:
        """Queue ``event`` for ``handle``; False when the loop is closed."""
        if self.loop.is_closed():
            return False
        self.items.append((handle, event))
        if not self.scheduled:
            self.scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the consumer's loop is closed
                return False
        return True

    def _deliver(self) -> None:
        self.scheduled = False
        items = self.items
        while items:
            handle, event = items.popleft()
            handle.deliver(event)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = \
    weakref.WeakKeyDictionary()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    """The loop's mailbox (made on the loop's own thread, where handles are created)."""
    box = _mailboxes.get(loop)
    if box is None:
        box = _mailboxes[loop] = _Mailbox(loop)
    return box


class AsyncHandle:
    """Events of one request for an asyncio consumer on ``loop``.

    The mailbox appends to ``events`` on the loop and wakes a waiting :meth:`aget` through a
    bare future: no task, queue or ``asyncio.wait`` per token.
    """

    __slots__ = ("_box", "_sent", "_taken", "_waiter", "events", "gone", "limit", "loop",
                 "request_id")

    def __init__(self, request_id: Hashable, loop: asyncio.AbstractEventLoop,
                 limit: int = MAX_BUFFERED_EVENTS) -> None:
        self.request_id = request_id
        self.loop = loop
        self.limit = limit
        self.gone = False
        self.events: deque[Event] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._box = _mailbox(loop)
        self._sent = 0  # written on the engine's thread only
        self._taken = 0  # written on the consumer's loop only

    def sink(self, event: Event) -> bool:
        """Called on the engine's thread: hand the event to the consumer's loop."""
        if self.gone:
            return False
        if not self._box.post(self, event):
            self.gone = True
            return False
        self._sent += 1
        return self._sent - self._taken <= self.limit

    def deliver(self, event: Event) -> None:
        """Called on the loop (by the mailbox): buffer ``event``, wake the reader."""
        self.events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get(self, timeout: float | None) -> Event:
        """Not for blocking consumers (they get a :class:`SyncHandle`)."""
        raise TypeError("AsyncHandle is read with aget()")

    async def aget(self, timeout: float | None) -> Event:
        """The next event; ``TimeoutError`` past ``timeout`` seconds.

        Not ``asyncio.wait_for``: before Python 3.12 it can swallow a cancellation that
        arrives together with an event, and a cancelled consumer must always cancel. A
        cancellation here propagates from the ``await`` as it should.
        """
        if not self.events:
            waiter = self._waiter = self.loop.create_future()
            timer = None if timeout is None else self.loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            except TimeoutError:
                if not self.events:  # (an event that raced the timer still counts)
                    raise
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        self._taken += 1
        return self.events.popleft()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class InlineHandle:
    """Events of one request on an engine that the consumer's thread ticks while waiting."""

    __slots__ = ("_engine", "_events", "gone", "limit", "request_id")

    def __init__(self, request_id: Hashable, engine: Engine,
                 limit: int = MAX_BUFFERED_EVENTS) -> None:
        self.request_id = request_id
        self.limit = limit
        self.gone = False
        self._engine = engine
        self._events: deque[Event] = deque()

    def sink(self, event: Event) -> bool:
        """Called from inside ``engine.tick`` (on the consumer's thread)."""
        if self.gone:
            return False
        self._events.append(event)
        return len(self._events) <= self.limit

    def get(self, timeout: float | None) -> Event:
        """Tick until the request has an event; ``TimeoutError`` when the engine has no work
        left that could produce one (a request waiting for a slot nobody frees)."""
        while not self._events:
            if not self._engine.tick():
                raise TimeoutError
        return self._events.popleft()

    async def aget(self, timeout: float | None) -> Event:
        """As :meth:`get`, yielding to the event loop between ticks."""
        while not self._events:
            if not self._engine.tick():
                raise TimeoutError
            await asyncio.sleep(0)
        return self._events.popleft()
