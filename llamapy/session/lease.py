"""The slot a :class:`~llamapy.session.Session` leases, and the ways the lease ends.

- :meth:`SessionLease.release` (``Session.close``): the lease ends now, on the runtime's
  thread; quiet when the lease was reclaimed already.
- The session is garbage-collected without ``close()``: a ``weakref.finalize`` (which holds
  the runtime and the lease id, never the session) posts the release to the runtime's thread
  (``Runtime.release_later``). It touches no native state, so it is safe on any thread and at
  interpreter exit.
- The lease sits unused for ``SessionConfig.lease_idle_timeout`` seconds: the engine reclaims
  the slot (:mod:`llamapy.engine.lease_idle`) and sets :attr:`SessionLease.expired`; the
  session's next primitive raises :class:`~llamapy.errors.LeaseExpiredError` (:meth:`check`).
- The coroutine opening the session gives up (cancelled, or ``asyncio.wait_for`` timed out)
  while the open runs on its worker thread: :func:`open_off_loop` closes the session that
  thread opens, whenever it finishes, so nobody's lease outlives its caller.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol, TypeVar

from llamapy.errors import LeaseExpiredError, UnknownLeaseError

if TYPE_CHECKING:
    from llamapy.engine.request import CacheKey
    from llamapy.runtime import Runtime
    from llamapy.session.config import SessionConfig

__all__ = ["SessionLease", "open_off_loop"]


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)
log = logging.getLogger("llamapy.session")


class SessionLease:
    """A leased slot held for ``owner`` (see the module); waits up to
    ``config.lease_timeout`` for it (``LeaseTimeoutError``)."""

    def __init__(self, owner: object, runtime: Runtime, key: CacheKey,
                 config: SessionConfig) -> None:
        self.expired = threading.Event()
        self.idle_timeout = config.lease_idle_timeout
        self._runtime = runtime
        self.lease_id = runtime.lease(key, config.lease_timeout, idle_s=self.idle_timeout,
                                      on_expire=self.expired.set)
        self._finalizer = weakref.finalize(owner, runtime.release_later, self.lease_id)

    def check(self) -> None:
        """Raise :class:`~llamapy.errors.LeaseExpiredError` once the lease was reclaimed."""
        if self.expired.is_set():
            raise LeaseExpiredError(f"the session's slot was reclaimed after "
                                    f"{self.idle_timeout} s unused (lease_idle_timeout); "
                                    "open a new session")

    def release(self) -> None:
        """End the lease now (the finalizer is dropped); nothing to do once reclaimed."""
        self._finalizer.detach()
        if self.expired.is_set():
            return
        try:
            self._runtime.release(self.lease_id)
        except UnknownLeaseError:
            if not self.expired.is_set():  # (else reclaimed meanwhile)
                raise


async def open_off_loop(open_fn: Callable[[], C], name: str = "llamapy-open-session") -> C:
    """``open_fn()`` (a blocking open: loading, leasing) on a worker thread, awaited without
    blocking the event loop. A caller that gives up gets its ``CancelledError`` at once; the
    open then never starts if it had not, and what it opens later is closed on a thread of
    its own (see the module)."""
    opened: Future[C] = Future()

    def work() -> None:
        if not opened.set_running_or_notify_cancel():
            return  # the caller gave up before the open started
        try:
            opened.set_result(open_fn())
        except BaseException as exc:
            opened.set_exception(exc)

    threading.Thread(target=work, name=name, daemon=True).start()
    try:
        return await asyncio.shield(asyncio.wrap_future(opened))
    except BaseException:  # cancelled, or wait_for's timeout: hand back what it opens
        if not opened.cancel():
            opened.add_done_callback(_close_abandoned)
        raise


def _close_abandoned(opened: Future[C]) -> None:
    """Close what an abandoned open opened, off the thread that runs this callback (which may
    be the event loop's)."""
    if opened.cancelled() or opened.exception() is not None:
        return
    threading.Thread(target=_close_quietly, args=(opened.result(),),
                     name="llamapy-close-abandoned", daemon=True).start()


def _close_quietly(session: _Closable) -> None:
    try:
        session.close()
    except Exception:  # nobody to raise it to
        log.exception("closing a session its caller abandoned failed")
