"""How a managed model's server is started, closed and reaped: the machinery under
:class:`~llamapy.server.ModelManager` (see its module for the rules).

A load runs on a thread of its own: it closes the servers evicted to make room and waits for
the unloads under way (their memory must be free first), then starts the new server and waits
for it; a failure is stored as the model's typed error. Servers are closed off the caller's
thread, so a lease released on an event loop never waits for one. One reaper thread unloads
models idle past their ``keep_alive``, sleeping until the next deadline or until a lease or
hold changes (nothing polls), and calls ``on_idle_unload`` first. Methods run with the lock
held unless they say otherwise.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import ClosedError, LlamapyError, LoadFailedError
from .budget import Entry, plan_room
from .model_spec import KEEP_FOREVER, ModelState, ServerFactory, ServerLike

__all__ = ["Lifecycle"]

log = logging.getLogger("llamapy.server")


class Lifecycle:
    """The entries, their lock, and the loads, closes and idle unloads that change them."""

    def __init__(self, models_max: int, memory_mb: float, server_factory: ServerFactory,
                 on_idle_unload: Callable[[str, Any], None] | None) -> None:
        self.models_max = models_max
        self.memory_mb = memory_mb
        self._factory = server_factory
        self._on_idle_unload = on_idle_unload
        self._cond = threading.Condition()
        self._entries: dict[str, Entry] = {}
        self._closed = False
        self._closers: set[threading.Thread] = set()

    def _wait(self, deadline: float | None) -> bool:
        if deadline is None:
            self._cond.wait()
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self._cond.wait(remaining)
        return True

    def _start_load(self, entry: Entry) -> bool:
        """Make room and start loading ``entry``; False when no room can be made yet."""
        victims = plan_room(self._entries.values(), entry, self.models_max, self.memory_mb)
        if victims is None:
            return False
        evicted = [self._drop(v) for v in victims]
        entry.move(ModelState.LOADING)
        entry.error = None
        threading.Thread(target=self._load, args=(entry, evicted), daemon=True,
                         name=f"llamapy-load-{entry.spec.name}").start()
        return True

    def _drop(self, entry: Entry) -> Any:
        """Mark ``entry`` unloaded; return its server for the caller to close unlocked."""
        entry.move(ModelState.UNLOADED)
        server, entry.server = entry.server, None
        entry.error = None
        entry.unload_pending = False
        return server

    def _idle_drop(self, entry: Entry) -> Any:
        """The server to close now that ``entry`` has no users (keep_alive 0 or a pending
        unload), else None."""
        if entry.users or entry.holds or entry.state is not ModelState.LOADED:
            return None
        if entry.unload_pending:
            return self._drop(entry)
        if entry.keep_alive == 0 and not entry.pinned:
            if self._on_idle_unload is None:
                return self._drop(entry)
            self._cond.notify_all()  # the reaper unloads it, after the hook
        return None

    def _release(self, entry: Entry) -> None:
        """A lease ended (called unlocked)."""
        with self._cond:
            entry.users -= 1
            entry.last_used = time.monotonic()
            self._close_later([self._idle_drop(entry)])
            self._cond.notify_all()

    def _close_later(self, servers: list[Any]) -> None:
        """Close ``servers`` on a thread of their own (called with the lock held), so a lease
        released on an event loop never waits for it; the next load waits for it instead."""
        servers = [s for s in servers if s is not None]
        if servers:
            thread = threading.Thread(target=self._close_all, args=(servers,), daemon=True,
                                      name="llamapy-unload")
            self._closers.add(thread)
            thread.start()

    def _close_all(self, servers: list[Any]) -> None:
        try:
            for server in servers:
                server.close()
        finally:
            with self._cond:
                self._closers.discard(threading.current_thread())
                self._cond.notify_all()

    def _load(self, entry: Entry, evicted: list[Any]) -> None:
        """Loader thread (unlocked): close the evicted servers and wait for the unloads under
        way (their memory must be free first), then start and await ours."""
        for old in evicted:
            if old is not None:
                old.close()
        with self._cond:
            pending = list(self._closers)
        for thread in pending:
            thread.join()
        server: ServerLike | None = None
        error: LlamapyError | None = None
        try:
            server = self._factory(entry.spec)
            server.wait_ready(None)
        except Exception as exc:  # stored as the model's typed error
            error = exc if isinstance(exc, LlamapyError) else LoadFailedError(exc)
            if server is not None:
                server.close()
                server = None
        self._finish_load(entry, server, error)

    def _finish_load(self, entry: Entry, server: ServerLike | None,
                     error: LlamapyError | None) -> None:
        with self._cond:
            closing = server if self._closed else None
            if error is not None or self._closed:
                entry.move(ModelState.FAILED)
                entry.error = error or ClosedError("the model manager is closed")
            else:
                entry.move(ModelState.LOADED)
                entry.server = server
                entry.last_used = time.monotonic()
                closing = self._idle_drop(entry)
            self._cond.notify_all()
        if closing is not None:
            closing.close()

    # --- idle TTL -----------------------------------------------------------------------------

    def _reap_loop(self) -> None:
        """Reaper thread: unload models idle past their keep_alive; sleeps until the next
        deadline or until a lease changes."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                expired = [e for e in self._entries.values()
                           if self._reaped(e) and e.keep_alive <= now - e.last_used]
                for entry in expired:
                    self._before_idle_unload(entry)
                self._close_later([self._drop(e) for e in expired])
                if not expired:
                    self._cond.wait(self._next_expiry(now))

    def _reaped(self, entry: Entry) -> bool:
        """Whether the reaper unloads ``entry`` once its keep_alive runs out: an evictable
        model with a finite keep_alive (0 only with a hook: without one a release unloads it)."""
        return entry.evictable and entry.keep_alive < KEEP_FOREVER and (
            entry.keep_alive > 0 or self._on_idle_unload is not None)

    def _before_idle_unload(self, entry: Entry) -> None:
        if self._on_idle_unload is None:
            return
        try:
            self._on_idle_unload(entry.spec.name, entry.server)
        except Exception:  # a failing hook must not keep the model loaded or stop the reaper
            log.exception("on_idle_unload failed for model %r", entry.spec.name)

    def _next_expiry(self, now: float) -> float | None:
        """Seconds until the next idle model's keep_alive runs out (None: no such model)."""
        deadlines = [e.last_used + e.keep_alive - now for e in self._entries.values()
                     if self._reaped(e)]
        return max(min(deadlines), 0.0) if deadlines else None
