"""``InlineRuntime``: an engine ticked in the caller's thread while it waits for an event.

For deterministic tests and simulations (the fake backend): nothing runs between two calls,
so interleavings are exactly the caller's. One thread only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

from llamapy.engine.engine import Engine
from llamapy.engine.request import CacheKey, ErrorEvent, Request, RequestTimings
from llamapy.errors import LeaseTimeoutError, LlamapyError
from llamapy.runtime.handles import EventHandle, InlineHandle

__all__ = ["InlineRuntime"]

T = TypeVar("T")


class InlineRuntime:
    """A :class:`~llamapy.runtime.base.Runtime` over ``engine``, driven by its callers."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

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
        return fn(self.engine)

    async def acall(self, fn: Callable[[Engine], T], timeout: float | None = 60.0) -> T:
        """:meth:`call` for a coroutine: runs ``fn(engine)`` now, on the event loop's thread
        (which owns the engine)."""
        return fn(self.engine)

    def open_handle(self, request_id: Hashable,
                    loop: asyncio.AbstractEventLoop | None = None) -> EventHandle:
        """A handle whose waits tick the engine."""
        return InlineHandle(request_id, self.engine)

    def lease(self, key: CacheKey, timeout: float) -> int:
        """Lease a slot, ticking the engine until one is free or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            lease_id = self.engine.lease(*key)
            if lease_id is not None:
                return lease_id
            if not self.engine.tick() or time.monotonic() >= deadline:
                raise LeaseTimeoutError(f"no slot could be leased within {timeout} s")

    def release(self, lease_id: int) -> None:
        """End the lease."""
        self.engine.release(lease_id)
