"""The model behind the app: served at once, or still being fetched/loaded in the background.

``ModelHost(server, **options)`` serves a running :class:`~llamapy.server.Server` (which may
itself still be loading its model); ``ModelHost(loader, **options)`` first runs ``loader()`` in
a thread (fetching the default model, say) while the HTTP server already answers ``/health``
with 503. ``options`` are those of :class:`~llamapy.openai_api.ServedModel` (``name``,
``chat_template``, ``request_timeout``).

With ``sleep_idle_seconds`` (and a loader, which it reruns to wake up) the model sleeps after
that many idle seconds (:mod:`llamapy.serve.sleep`): :attr:`ModelHost.sleeping`, :meth:`enter`
/ :meth:`leave` around each request that runs on the model, :meth:`steady` around each read
of a route that never wakes it, ``sleep_hooks`` called with the
served model just before it is unloaded.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import InvalidOptionError, LlamapyError, LoadFailedError, NotReadyError
from ..openai_api import ServedModel
from ..server import Server
from .sleep import IdleClock

log = logging.getLogger("llamapy.serve")

Loader = Callable[[], Server]


class ModelHost:
    """Holds the :class:`ServedModel`; :meth:`get` raises the typed reason it is unavailable."""

    def __init__(self, target: Server | Loader, *, sleep_idle_seconds: float | None = None,
                 **served: Any) -> None:
        self._options = served
        self._served: ServedModel | None = None
        self._error: LlamapyError | None = None
        self._lock = threading.Lock()
        self._loaded = threading.Event()  # the loader returned or failed
        self._wake_lock = threading.Lock()
        self._loader = None if isinstance(target, Server) else target
        self._sleeping = False
        self.sleep_hooks: list[Callable[[ServedModel], None]] = []
        self.clock: IdleClock | None = None
        if sleep_idle_seconds is not None and sleep_idle_seconds >= 0:
            if self._loader is None:
                raise InvalidOptionError("sleep_idle_seconds needs a loader to reload the "
                                         "model with", option="sleep_idle_seconds")
            self.clock = IdleClock(sleep_idle_seconds, self._sleep)
        if isinstance(target, Server):
            self._served = ServedModel(target, **served)
            self._loaded.set()
        else:
            threading.Thread(target=self._load, args=(target,), name="llamapy-serve-load",
                             daemon=True).start()

    def _load(self, loader: Loader) -> None:
        try:
            server = loader()
        except Exception as exc:  # a foreign error while fetching: report, never die silently
            log.error("model load failed: %s", exc)
            error = exc if isinstance(exc, LoadFailedError) else LoadFailedError(exc)
            with self._lock:
                self._error = error
            self._loaded.set()
            return
        served = ServedModel(server, **self._options)
        with self._lock:
            self._served = served
        self._loaded.set()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Block until the model has loaded or failed to (at most ``timeout`` s); return
        whether it did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._loaded.wait(timeout):
            return False
        served = self._served
        if served is None:
            return True
        try:
            served.server.wait_ready(None if deadline is None
                                     else max(0.0, deadline - time.monotonic()))
        except NotReadyError:
            return False
        except LlamapyError:
            pass  # failed: done all the same
        return True

    @property
    def served(self) -> ServedModel | None:
        """The served model once the loader returned (its server may still be loading)."""
        return self._served

    def get(self) -> ServedModel:
        """The served model if its server is ready; else raise why not (503)."""
        with self._lock:
            served, error = self._served, self._error
        if error is not None:
            raise error
        if served is None:
            raise NotReadyError("the model is asleep" if self._sleeping else "loading model")
        served.server.fetch_model()  # raises NotReadyError / LoadFailedError / NotRunningError
        return served

    def status(self) -> str:
        """``loading``, ``ready`` or ``failed``."""
        try:
            self.get()
        except NotReadyError:
            return "loading"
        except LlamapyError:
            return "failed"
        return "ready"

    @property
    def sleeping(self) -> bool:
        """Whether the model was unloaded for idleness (``--sleep-idle-seconds``)."""
        return self._sleeping

    @contextlib.contextmanager
    def steady(self) -> Iterator[bool]:
        """Hold the model awake or asleep while a read-only route reads it (without counting
        as activity); yields whether it is asleep. A sleep that is under way is waited for:
        the route never sees the model half closed."""
        if self.clock is None:
            yield False
            return
        self.clock.pin()
        try:
            yield self._sleeping
        finally:
            self.clock.unpin()

    def enter(self) -> None:
        """A request that runs on the model starts: wake the model first (blocking until it is
        loaded again; raises :class:`LoadFailedError` if that fails)."""
        if self.clock is None:
            return
        self.clock.enter()
        with self._wake_lock:
            if not self._sleeping:
                return
            assert self._loader is not None
            log.info("waking up: reloading the model")
            server = self._loader().wait_ready(None)
            with self._lock:
                self._served = ServedModel(server, **self._options)
                self._sleeping = False

    def leave(self) -> None:
        """That request ended."""
        if self.clock is not None:
            self.clock.leave()

    def _sleep(self) -> bool:
        """Unload the model (no request in flight: the idle clock's lock is held)."""
        with self._lock:
            served = self._served
        if served is None or not served.server.ready:
            return False
        for hook in self.sleep_hooks:
            hook(served)
        with self._lock:
            self._served = None
            self._sleeping = True
        log.info("idle: the model sleeps (unloaded until the next request)")
        served.server.close()
        return True

    def close(self) -> None:
        """Stop the idle clock; close the server (when the app owns it)."""
        if self.clock is not None:
            self.clock.close()
        if self._served is not None:
            self._served.server.close()
