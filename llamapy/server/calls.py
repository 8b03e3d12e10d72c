"""One generation call of a ``Server``, validated before anything waits or is submitted.

:func:`prepare_call` turns a call's :class:`~.intent.GenerationIntent` (or its keyword
options, resolved by :func:`~.intent.resolve_intent`: every spelling renamed to its option,
unknown keys and bad values refused, values checked against the server's limits) into a
:class:`Call`. The :class:`Call` keeps the request id and the time budget: ``timeout`` is one
deadline from the call (whole-call) or the bound of each wait (per chunk), and the wait for a
model still loading counts against it (:class:`ReadySignal` waits for it without blocking an
event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine import Request
from ..engine.media import MediaPrompt
from ..errors import RequestTimeoutError
from ..options.sampling import RequestOptions
from .intent import GenerationIntent, canonical_options, deadline_of, resolve_intent
from .options import ResolvedStart

__all__ = ["Call", "ReadySignal", "canonical_options", "load_timeout_error", "prepare_call",
           "prompt_ids", "with_checkpoint_hints"]


@dataclass(slots=True)
class Call:
    """A validated call: its request's id and options, and its time budget."""

    request_id: Hashable
    options: RequestOptions
    timeout: float | None
    per_event: bool
    #: ``time.monotonic()`` instant the whole call must end by (None: per event, or unbounded).
    deadline: float | None

    def left(self) -> float | None:
        """Seconds left for the next wait (the per-event bound, or to the deadline)."""
        if self.deadline is None:
            return self.timeout
        return max(0.0, self.deadline - time.monotonic())

    def request(self, token_ids: Sequence[int]) -> Request:
        """The request to submit for ``token_ids`` (a
        :class:`~llamapy.engine.media.MediaPrompt` brings its media and checkpoint hints)."""
        if isinstance(token_ids, MediaPrompt):
            media, hints = token_ids.media, token_ids.checkpoint_hints
        else:
            media, hints = (), ()
        return Request(request_id=self.request_id, token_ids=list(token_ids),
                       options=self.options, media=media, checkpoint_hints=hints)


def with_checkpoint_hints(token_ids: Sequence[int], hints: Sequence[int]) -> Sequence[int]:
    """``token_ids`` (media kept) hinting where a model whose state cannot be trimmed should
    keep a restore point (:attr:`~llamapy.engine.request.Request.checkpoint_hints`)."""
    media = token_ids.media if isinstance(token_ids, MediaPrompt) else ()
    return MediaPrompt(token_ids, media, hints)


def prompt_ids(token_ids: Sequence[int]) -> Sequence[int]:
    """A call's prompt as given: a :class:`~llamapy.engine.media.MediaPrompt` as it is (a
    copy would drop its media), any other sequence as a list."""
    return token_ids if isinstance(token_ids, MediaPrompt) else list(token_ids)


def prepare_call(source: GenerationIntent | Mapping[str, Any], start: ResolvedStart, *,
                 per_event: bool, default_timeout: float | None) -> Call:
    """A call of ``source`` (an intent, or keyword options resolved now); the deadline starts
    now."""
    intent = source if isinstance(source, GenerationIntent) else resolve_intent(source, start)
    timeout = intent.timeout_or(default_timeout)
    return Call(request_id=intent.new_id(), options=intent.options, timeout=timeout,
                per_event=per_event, deadline=deadline_of(timeout, per_event))


def load_timeout_error(timeout: float | None) -> RequestTimeoutError:
    """The timeout of a call that ran out while the model was still loading."""
    return RequestTimeoutError(f"timed out after {timeout} s waiting for the model to load")


class ReadySignal:
    """Awaitable view of a ``threading.Event`` (a model's load ending): one helper thread per
    event, started by the first waiter, wakes every waiting event loop when it is set, so an
    ``await`` never blocks its loop and no executor thread waits per call."""

    def __init__(self, event: threading.Event) -> None:
        self._event = event
        self._lock = threading.Lock()
        self._waiters: list[asyncio.Future[None]] = []
        self._fired = False
        self._thread: threading.Thread | None = None

    async def wait(self, timeout: float | None) -> bool:
        """Whether the event was set within ``timeout`` seconds (None: no bound)."""
        if self._event.is_set():
            return True
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._fired:
                return True
            self._waiters.append(future)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, daemon=True,
                                                name="llamapy-ready")
                self._thread.start()
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            return self._event.is_set()
        finally:
            with self._lock:
                if future in self._waiters:
                    self._waiters.remove(future)
        return True

    def _watch(self) -> None:
        self._event.wait()
        with self._lock:
            self._fired = True
            waiters, self._waiters = self._waiters, []
        for future in waiters:
            with contextlib.suppress(RuntimeError):  # that waiter's loop closed meanwhile
                future.get_loop().call_soon_threadsafe(_wake, future)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
