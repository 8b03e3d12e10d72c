"""The runtime: the one owner of an engine, and what every layer above talks to.

A runtime runs one :class:`~llamapy.engine.engine.Engine` on one thread (the engine, its
backend and its llama context are touched by that thread only) and offers the few operations
callers need. Two implementations:

- :class:`~llamapy.runtime.loop.TickLoop`: a dedicated tick thread (``Server`` and standalone
  sessions); callers on any thread talk to it through its inbox.
- :class:`~llamapy.runtime.inline.InlineRuntime`: an engine ticked in the caller's own thread
  while it waits (deterministic tests and simulations on the fake backend).

Events are read through :mod:`llamapy.runtime.client`, the one event client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Protocol, TypeVar

from llamapy.engine.engine import Engine
from llamapy.engine.request import CacheKey, Request
from llamapy.runtime.handles import EventHandle

__all__ = ["Runtime"]

T = TypeVar("T")


class Runtime(Protocol):
    """What owns an engine (see the module docstring). Every method is safe from any thread.

    - ``submit``: hand a request to the engine; any error (invalid, queue full, overflow,
      closed) reaches ``request.sink`` as an ``ErrorEvent``, never as an exception here.
    - ``cancel``: cancel a queued or running request (unknown ids are ignored).
    - ``call``: run ``fn(engine)`` on the owner thread between ticks and return its result
      (or raise its exception); ``ClosedError`` once the runtime is closed; ``TimeoutError``
      past ``timeout`` seconds.
    - ``acall``: :meth:`call` awaited on an event loop (no thread blocked while it waits).
    - ``open_handle``: the event handle for a request: a blocking one, or one read on
      ``loop``.
    - ``lease`` / ``release``: a slot leased for a session, waiting up to ``timeout`` seconds
      for one to free (``LeaseTimeoutError``); ``idle_s`` bounds how long the lease may sit
      unused before it is reclaimed and ``on_expire`` called (on the owner thread: see
      :mod:`llamapy.engine.lease_idle`).
    - ``release_later``: :meth:`release` without waiting, from any thread (a finalizer): the
      release is posted to the owner thread; a lease gone meanwhile is ignored.
    """

    def submit(self, request: Request) -> None: ...

    def cancel(self, request_id: Hashable) -> None: ...

    def call(self, fn: Callable[[Engine], T], timeout: float | None = 60.0) -> T: ...

    async def acall(self, fn: Callable[[Engine], T], timeout: float | None = 60.0) -> T: ...

    def open_handle(self, request_id: Hashable,
                    loop: asyncio.AbstractEventLoop | None = None) -> EventHandle: ...

    def lease(self, key: CacheKey, timeout: float, *, idle_s: float | None = None,
              on_expire: Callable[[], None] | None = None) -> int: ...

    def release(self, lease_id: int) -> None: ...

    def release_later(self, lease_id: int) -> None: ...
