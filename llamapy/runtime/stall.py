"""``StallWatch``: notices a model thread that is stuck in one unit of work.

The tick thread marks the start (:meth:`StallWatch.begin`) and the end (:meth:`StallWatch.end`)
of each unit of work it does (a tick, a command). A watcher thread sleeps until the current
unit's deadline; if that unit is still running then, the thread is stalled (a native call that
does not return) and ``on_stall`` runs, once, on the watcher thread, unless ``progress``
(a count the model's computation advances: libllama's abort callback is called between the
nodes of a decode's graph) moved since the last look, which makes the unit a long decode at
work: its deadline moves on by the bound. The watcher wakes at most once per bound while the
thread works and blocks without a timeout while it is idle, so the marks cost the tick thread
two uncontended lock acquisitions and no wake-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["StallWatch"]

log = logging.getLogger("llamapy.runtime")


class StallWatch:
    """Calls ``on_stall(seconds)`` when a unit of work runs longer than ``bound_s``."""

    def __init__(self, bound_s: float, on_stall: Callable[[float], None],
                 name: str = "llamapy-stall-watch",
                 progress: Callable[[], int] | None = None) -> None:
        self.bound_s = bound_s
        self._on_stall = on_stall
        self._progress = progress
        self._seen = 0  # the progress count at the last look at the unit
        self._unit: float | None = None  # the unit (its start) that count belongs to
        self._cond = threading.Condition()
        self._since: float | None = None  # start of the unit running now
        self._parked = False  # the watcher waits with no deadline
        self._closed = False
        self.fired = False
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self._thread.start()

    def begin(self) -> None:
        """A unit of work starts (on the watched thread)."""
        with self._cond:
            self._since = time.monotonic()
            if self._parked:
                self._cond.notify()

    def end(self) -> None:
        """The unit of work ended."""
        with self._cond:
            self._since = None

    def close(self) -> None:
        """Stop watching (idempotent); the watcher thread ends."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                since = self._since
                self._parked = since is None
                if since is None:
                    self._cond.wait()
                    continue
                if since != self._unit:  # a unit not looked at yet: its count so far
                    self._unit, self._seen = since, self._count()
                late = time.monotonic() - since
                if late < self.bound_s:
                    self._cond.wait(self.bound_s - late)
                    continue
                if self._moved():  # a long decode at work: its deadline moves on
                    self._since = self._unit = time.monotonic()
                    continue
                self.fired = self._closed = True
                break
        if self.fired:
            self._fire(late)

    def _count(self) -> int:
        return 0 if self._progress is None else self._progress()

    def _moved(self) -> bool:
        """Whether the progress count moved since the last look (False without one)."""
        seen, self._seen = self._seen, self._count()
        return self._seen != seen

    def _fire(self, late: float) -> None:
        try:
            self._on_stall(late)
        except Exception:
            log.exception("the stall callback failed")
