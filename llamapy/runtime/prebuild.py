"""Samplers whose construction is costly, built off the tick thread.

Parsing a request's grammar can take seconds (a grammar of many thousand alternatives), and so
can a DRY sampler's scan of the vocabulary for its sequence breakers; on the tick thread that
time would stall every slot. :class:`SamplerPrebuilder` builds such a request's sampler on its
own thread (the backend's ``new_sampler`` may be called from any thread) and then hands the
request, sampler attached, to the tick thread's inbox. A failure (a bad grammar) is the
request's error event, sent from this thread.

A cancel that arrives while the sampler is built is forwarded after the request itself, so the
engine admits it and cancels it at once (one final event, from the engine, as always); a request
cancelled before its build starts is not built and ends ``cancelled`` from here. The requests
waiting for a build count against the engine's ``max_queue``: past it, a 429 at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor

from llamapy.engine.backend import Backend
from llamapy.engine.options import RequestOptions
from llamapy.engine.request import DoneEvent, ErrorEvent, FinishReason, Request, RequestTimings
from llamapy.errors import ClosedError, EngineError, LlamapyError, QueueFullError

__all__ = ["SamplerPrebuilder", "costly_sampler"]

log = logging.getLogger("llamapy.runtime")


def costly_sampler(request: Request) -> bool:
    """Whether building ``request``'s sampler may take long: it has a grammar or DRY on.
    (Options that are not :class:`RequestOptions` are left for the engine to refuse.)"""
    options = request.options
    if not isinstance(options, RequestOptions) or options.max_tokens == 0:
        return False
    return bool(options.sampling.grammar) or options.sampling.dry_multiplier > 0


class SamplerPrebuilder:
    """Builds samplers on one worker thread (see the module). ``backend()`` gives the backend
    (it may wait for the model's load, and raise why it failed; None once closed);
    ``forward(request, cancelled)`` puts the request (and, if ``cancelled``, its cancel) on
    the tick thread's inbox.
    ``max_pending()`` bounds the requests waiting for a build (0: unbounded): one more is
    refused at once with ``QueueFullError``, as the engine's queue refuses."""

    def __init__(self, backend: Callable[[], Backend | None],
                 forward: Callable[[Request, bool], None],
                 max_pending: Callable[[], int] = lambda: 0) -> None:
        self._backend = backend
        self._forward = forward
        self._max_pending = max_pending
        self._lock = threading.Lock()
        self._building: set[Hashable] = set()
        self._cancelled: set[Hashable] = set()
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamapy-sampler")

    def submit(self, request: Request) -> None:
        """Build ``request``'s sampler, then forward it; errors go to its sink."""
        limit = self._max_pending()
        with self._lock:
            if self._closed:
                error: LlamapyError | None = ClosedError("runtime is closed")
            elif 0 < limit <= len(self._building):
                error = QueueFullError(limit)
            else:
                error = None
                self._building.add(request.request_id)
        if error is not None:
            _fail(request, error)
            return
        self._pool.submit(self._build, request)

    def cancel(self, request_id: Hashable) -> None:
        """Remember a cancel for a request still being built (else nothing to do)."""
        with self._lock:
            if request_id in self._building:
                self._cancelled.add(request_id)

    def close(self) -> None:
        """Stop: requests not yet built end with ``ClosedError``; waits for the one being
        built (a native call cannot be interrupted)."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)

    def _build(self, request: Request) -> None:
        request_id = request.request_id
        with self._lock:
            skip = request_id in self._cancelled
        try:
            if skip:  # cancelled while waiting: not built, ended as the engine ends one
                self._finish(request_id)
                _deliver(request, DoneEvent(request_id, FinishReason.CANCELLED, 0,
                                            len(request.token_ids), RequestTimings()))
                return
            backend = None if self._closed else self._backend()
            if backend is None:
                raise ClosedError("runtime is closed")
            request.sampler = backend.new_sampler(request.options.sampling)
        except Exception as exc:  # typed (a bad grammar) or foreign: that request's error
            self._finish(request_id)
            _fail(request, exc if isinstance(exc, LlamapyError) else EngineError("sampler", exc))
            return
        with self._lock:  # a cancel now either comes before this or finds the id gone
            cancelled = request_id in self._cancelled
            self._forward(request, cancelled)
            self._building.discard(request_id)
            self._cancelled.discard(request_id)

    def _finish(self, request_id: Hashable) -> None:
        with self._lock:
            self._building.discard(request_id)
            self._cancelled.discard(request_id)


def _fail(request: Request, exc: LlamapyError) -> None:
    _deliver(request, ErrorEvent(request.request_id, exc, RequestTimings()))


def _deliver(request: Request, event: DoneEvent | ErrorEvent) -> None:
    try:
        request.sink(event)
    except Exception:
        log.exception("request sink failed")
