"""``InlineRuntime``: an engine ticked in the caller's thread while it waits for an event.

For deterministic tests and simulations (the fake backend): nothing runs between two calls,
so interleavings are exactly the caller's. One thread only, but for
:meth:`~InlineRuntime.release_later` (a finalizer's, on whatever thread collects): it is
carried out at the next lease or call of any inline runtime on the same engine.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Hashable
from typing import TypeVar

from llamapy.engine.engine import Engine
from llamapy.engine.lease_idle import reclaim_idle_leases, release_if_held
from llamapy.engine.request import CacheKey, ErrorEvent, Request, RequestTimings
from llamapy.errors import LeaseTimeoutError, LlamapyError
from llamapy.runtime.handles import EventHandle, InlineHandle

__all__ = ["InlineRuntime"]

T = TypeVar("T")
#: Releases posted for each engine, carried out by whichever of its inline runtimes runs next.
_POSTED: weakref.WeakKeyDictionary[Engine, list[int]] = weakref.WeakKeyDictionary()


class InlineRuntime:
    """A :class:`~llamapy.runtime.base.Runtime` over ``engine``, driven by its callers."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._released = _POSTED.setdefault(engine, [])  # (list.append is atomic)

    def submit(self, request: Request) -> None:
        """Submit now; a rejection reaches the request's sink as an ``ErrorEvent``."""
        try:
            self.engine.submit(request)
        except LlamapyError as exc:
            request.sink(ErrorEvent(request.request_id, exc, RequestTimings()))

    def cancel(self, request_id: Hashable) -> None:
        """Cancel now."""
        self.engine.cancel(request_id)

    def call(self, fn: Callable[[Engine], T], timeout: float | None = 60.0) -> T:
        """Run ``fn(engine)`` now (this thread owns the engine)."""
        self._housekeep()
        return fn(self.engine)

    async def acall(self, fn: Callable[[Engine], T], timeout: float | None = 60.0) -> T:
        """:meth:`call` for a coroutine: runs ``fn(engine)`` now, on the event loop's thread
        (which owns the engine)."""
        return fn(self.engine)

    def open_handle(self, request_id: Hashable,
                    loop: asyncio.AbstractEventLoop | None = None) -> EventHandle:
        """A handle whose waits tick the engine."""
        return InlineHandle(request_id, self.engine)

    def lease(self, key: CacheKey, timeout: float, *, idle_s: float | None = None,
              on_expire: Callable[[], None] | None = None) -> int:
        """Lease a slot, ticking the engine until one is free or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            self._housekeep()
            lease_id = self.engine.lease(*key, idle_s=idle_s, on_expire=on_expire)
            if lease_id is not None:
                return lease_id
            if not self.engine.tick() or time.monotonic() >= deadline:
                raise LeaseTimeoutError(f"no slot could be leased within {timeout} s")

    def release(self, lease_id: int) -> None:
        """End the lease."""
        self.engine.release(lease_id)

    def release_later(self, lease_id: int) -> None:
        """End the lease at the next lease or call (safe from any thread)."""
        self._released.append(lease_id)

    def _housekeep(self) -> None:
        """Carry out posted releases and reclaim leases idle past their bound."""
        while self._released:
            release_if_held(self.engine, self._released.pop())
        reclaim_idle_leases(self.engine)
