"""``--sleep-idle-seconds N``: unload the model after N quiet seconds, reload it on demand.

The policy (llama-server's). A request on a route that runs on the model (the routes of
:data:`~llamapy.serve.multi.LEASE_PATHS` but ``/props``) is *activity*: :class:`WakeOnRequest`
counts it in flight for its whole response (streams included), waking the model first, so the
request waits for the reload. Once no request has been in flight for N seconds,
:class:`IdleClock` has the host put the model to sleep: the snapshots of ``/props`` (then
``is_sleeping: true``), ``/v1/models`` and the engine's stats are taken, then the server is
closed (weights and KV freed). While asleep ``/props`` and ``/v1/models`` answer from the
snapshots and ``/metrics`` renders with the engine's counters as they were (the HTTP-side
metrics stay live: a throughput window with nothing in it reads 0), none of them waking it;
``/health`` answers ``ok``. A wake-up does not start the next quiet spell until its request
ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import LlamapyError
from ..openai_api import ServedModel
from ..openai_api import llama_compat as compat
from .errors import error_response
from .multi import LEASE_PATHS, LEASE_PREFIXES

__all__ = ["WAKE_PATHS", "IdleClock", "WakeOnRequest", "sleep_snapshot"]

log = logging.getLogger("llamapy.serve")

#: Routes that wake a sleeping model: those that run on it, but ``/props`` (read-only).
WAKE_PATHS = LEASE_PATHS - {"/props"}


class IdleClock:
    """Requests in flight and the time the last one ended; calls ``on_idle`` on its own thread
    once none has been in flight for ``idle_s`` seconds.

    ``on_idle`` runs with the clock's lock held (so :meth:`enter` waits for it) and returns
    whether it slept; after a sleep the clock waits for the next request before counting again.
    """

    def __init__(self, idle_s: float, on_idle: Callable[[], bool]) -> None:
        self.idle_s = idle_s
        self._on_idle = on_idle
        self._cond = threading.Condition()
        self._users = 0
        self._pins = 0
        self._last = time.monotonic()
        self._armed = True
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="llamapy-sleep", daemon=True)
        self._thread.start()

    def enter(self) -> None:
        """A request starts (waits while the model is being put to sleep)."""
        with self._cond:
            self._users += 1
            self._armed = True

    def leave(self) -> None:
        """A request ended: the quiet spell starts now."""
        with self._cond:
            self._users -= 1
            self._last = time.monotonic()
            self._cond.notify_all()

    def pin(self) -> None:
        """A read-only route starts reading the model: it is not put to sleep until
        :meth:`unpin` (waits while it is being put to sleep). Not activity: the quiet spell
        goes on."""
        with self._cond:
            self._pins += 1

    def unpin(self) -> None:
        """That read ended."""
        with self._cond:
            self._pins -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the clock's thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                left = self._last + self.idle_s - time.monotonic()
                if self._users or self._pins or not self._armed:
                    self._cond.wait()
                elif left > 0:
                    self._cond.wait(left)
                elif self._sleep():
                    self._armed = False
                else:  # nothing to unload yet (the first load is still running)
                    self._last = time.monotonic()

    def _sleep(self) -> bool:
        try:
            return self._on_idle()
        except Exception:  # a failing close must not stop the clock
            log.exception("putting the model to sleep failed")
            return False


def sleep_snapshot(served: ServedModel, models: dict[str, Any]) -> dict[str, Any]:
    """What the read-only routes read while asleep: ``props`` (``is_sleeping: true``),
    ``models`` (``/v1/models``) and ``stats`` (the engine's, for ``/metrics``)."""
    return {"props": {**compat.props(served), "is_sleeping": True}, "models": models,
            "stats": served.server.stats()}


class WakeOnRequest:
    """ASGI middleware: a request on :data:`WAKE_PATHS` wakes the model and counts as activity
    until its response has been sent."""

    def __init__(self, app: ASGIApp, enter: Callable[[], None], leave: Callable[[], None]
                 ) -> None:
        self.app = app
        self.enter = enter
        self.leave = leave

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path in WAKE_PATHS or path.startswith(
                LEASE_PREFIXES)):
            await self.app(scope, receive, send)
            return
        try:
            await run_in_threadpool(self.enter)
        except LlamapyError as exc:  # the reload failed: its typed error
            self.leave()
            await error_response(exc)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.leave()
