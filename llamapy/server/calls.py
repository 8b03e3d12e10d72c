"""One generation call of a ``Server``, validated before anything waits or is submitted.

:func:`prepare_call` turns a call's keyword options into a :class:`Call`: every spelling is
renamed to its option (``temperature`` -> ``temp``, ``n_predict`` -> ``max_tokens``; one option
given under two spellings is an :class:`~llamapy.errors.InvalidOptionError`), unknown keys
raise :class:`~llamapy.errors.UnknownOptionError`, values are resolved and checked against the
server's limits. The :class:`Call` keeps the request id and the time budget: ``timeout`` is one
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

from ..adapters import resolve_adapters
from ..engine import Request, resolve_request_options
from ..errors import InvalidOptionError, RequestTimeoutError, UnknownOptionError
from ..options import canonical_name
from ..options.limits import check_limits
from ..options.sampling import RequestOptions
from ..runtime import new_request_id
from .options import ResolvedStart, call_option_keys

__all__ = ["Call", "ReadySignal", "canonical_options", "load_timeout_error", "prepare_call"]


def canonical_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` under their canonical names (see the module docstring)."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in options.items():
        name = canonical_name(key)
        if name in out:
            raise InvalidOptionError(f"{name}: given twice, as {given[name]!r} and {key!r}",
                                     option=name)
        out[name], given[name] = value, key
    unknown = set(out) - set(call_option_keys())
    if unknown:
        raise UnknownOptionError({given[k] for k in unknown}, call_option_keys(),
                                 where="request")
    return out


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
        """The request to submit for ``token_ids``."""
        return Request(request_id=self.request_id, token_ids=list(token_ids),
                       options=self.options)


def prepare_call(options: Mapping[str, Any], start: ResolvedStart, *, per_event: bool,
                 default_timeout: float | None) -> Call:
    """Validate a call's options (see the module docstring); the deadline starts now."""
    opts = canonical_options(options)
    timeout = opts.pop("timeout", default_timeout)
    request_id = opts.pop("request_id", None)
    if timeout is not None and (isinstance(timeout, bool) or
                                not isinstance(timeout, int | float) or timeout < 0):
        raise InvalidOptionError(f"timeout: a number of seconds >= 0 or None, got {timeout!r}",
                                 option="timeout")
    if "adapters" in opts:
        opts["adapters"] = resolve_adapters(opts["adapters"])
    resolved = resolve_request_options(opts, defaults=start.engine.sampling)
    check_limits(resolved, start.engine)  # at the edge: the engine checks again
    deadline = None if per_event or timeout is None else time.monotonic() + timeout
    return Call(request_id=new_request_id() if request_id is None else request_id,
                options=resolved, timeout=timeout, per_event=per_event, deadline=deadline)


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
