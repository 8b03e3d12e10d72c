"""Deadlines and cancellation of the one session call in flight.

A :class:`CallWatch` holds the deadline of one session primitive (``timeout=``: seconds for
the whole call, not per event) and the engine request it has in flight. Past the deadline, or
on :meth:`Session.cancel() <llamapy.session.Session.cancel>` from any thread or task, it asks
the runtime to cancel that request: the engine ends it with a cancelled final event, the
reader wakes at once, and :meth:`CallWatch.error` turns the resulting
:class:`~llamapy.errors.RequestCancelledError` into the error the caller sees
(:class:`~llamapy.errors.RequestTimeoutError` past the deadline).

Who fires the deadline: on a threaded runtime a timer thread (blocking callers) or the event
loop's ``call_later`` (coroutines, no thread); an inline runtime (the caller's thread ticks
the engine) is checked between events (:meth:`CallWatch.poll`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import TYPE_CHECKING, TypeVar

from llamapy.errors import InvalidOptionError, RequestCancelledError, RequestTimeoutError
from llamapy.runtime import InlineRuntime

if TYPE_CHECKING:
    from llamapy.engine.engine import Engine
    from llamapy.runtime import Runtime

__all__ = ["CALL_TIMEOUTS", "CallWatch"]

T = TypeVar("T")
#: What a runtime call past its timeout raises (distinct classes before Python 3.11).
CALL_TIMEOUTS = (TimeoutError, FutureTimeoutError, asyncio.TimeoutError)


class CallWatch:
    """The deadline and cancellation of one call (see the module docstring)."""

    def __init__(self, runtime: Runtime, timeout: float | None, what: str) -> None:
        if timeout is not None and not timeout > 0:
            raise InvalidOptionError(f"{what}: timeout must be a positive number of seconds "
                                     "or None", option="timeout")
        self.what = what
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.request_id: Hashable | None = None
        self.timed_out = False
        self.cancelled = False
        self._runtime = runtime
        self._timer: threading.Timer | asyncio.TimerHandle | None = None

    def left(self) -> float | None:
        """Seconds left (None: no deadline); ``RequestTimeoutError`` once none are."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.timed_out = True
            raise self._timeout_error()
        return left

    def arm(self, request_id: Hashable, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Watch ``request_id`` (about to be submitted): start the deadline's timer. Raises
        the typed error at once when the call was cancelled or is already past its deadline
        (nothing is submitted then)."""
        if self.cancelled:
            raise RequestCancelledError(f"{self.what} was cancelled")
        left = self.left()
        self.request_id = request_id
        if left is None:
            return
        if loop is not None:
            self._timer = loop.call_later(left, self.expire)
        elif not isinstance(self._runtime, InlineRuntime):
            timer = threading.Timer(left, self.expire)
            timer.daemon = True
            timer.start()
            self._timer = timer

    def recheck(self) -> None:
        """After submitting: repeat a cancel that raced the submission."""
        if self.cancelled or self.timed_out:
            self._cancel_request()

    def poll(self) -> None:
        """Between events: fire a deadline that has passed (an inline runtime has no timer)."""
        if self.deadline is not None and not self.timed_out and time.monotonic() >= self.deadline:
            self.expire()

    def expire(self) -> None:
        """The deadline passed: cancel the request."""
        self.timed_out = True
        self._cancel_request()

    def cancel(self) -> None:
        """Cancel the call (from any thread, or another task on the runtime's loop)."""
        self.cancelled = True
        self._cancel_request()

    def disarm(self) -> None:
        """The call ended: stop the deadline's timer."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def error(self, exc: BaseException) -> BaseException:
        """What the caller sees for ``exc``: past the deadline a ``RequestTimeoutError``, after
        :meth:`cancel` a ``RequestCancelledError``, else ``exc`` itself."""
        if isinstance(exc, RequestCancelledError | RequestTimeoutError):
            if self.timed_out:
                return self._timeout_error()
            if self.cancelled:
                return RequestCancelledError(f"{self.what} was cancelled")
        return exc

    def call(self, fn: Callable[[Engine], T]) -> T:
        """``runtime.call(fn)`` within the deadline (``RequestTimeoutError`` past it)."""
        left = self.left()
        try:
            return self._runtime.call(fn, 60.0 if left is None else left)
        except CALL_TIMEOUTS:
            self.timed_out = True
            raise self._timeout_error() from None

    async def acall(self, fn: Callable[[Engine], T]) -> T:
        """``await runtime.acall(fn)`` within the deadline."""
        left = self.left()
        try:
            return await self._runtime.acall(fn, 60.0 if left is None else left)
        except CALL_TIMEOUTS:
            self.timed_out = True
            raise self._timeout_error() from None

    def _cancel_request(self) -> None:
        request_id = self.request_id
        if request_id is not None:
            self._runtime.cancel(request_id)

    def _timeout_error(self) -> RequestTimeoutError:
        return RequestTimeoutError(f"{self.what} ran past its {self.timeout} s deadline; its "
                                   "request was cancelled")
