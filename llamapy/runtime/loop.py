"""``TickLoop``: the one thread that owns an engine (and its backend, context and model).

The thread builds what it hosts (``build()``, e.g. load a model and create its context), then
runs the engine's tick loop. Other threads talk to it only through its inbox, a blocking queue
of commands (submit, cancel, call, lease, close). With no work the thread blocks on the inbox
(idle is ~0% CPU; a waiting lease wakes it at its deadline, a lease's idle bound at its
expiry); with work it drains the inbox between ticks. A failed build answers every later
command with the typed load error.

Nothing a request sends ends the thread: a command that raises fails only the request it
carries (``EngineError``), and the engine's tick fails only the runs a failure concerns. If
the thread dies anyway (a bug), the loop is ``CRASHED``: every command is answered with
:class:`~llamapy.errors.RuntimeDiedError`, in-flight requests end with ``ClosedError`` as
the engine closes, and the ``on_crash`` callbacks run (the HTTP server exits so that a
supervisor restarts it). A thread stuck in one tick or command for ``stall_timeout`` seconds
(a native call that does not return) counts as dead the same way (:mod:`.stall`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, TypeVar

from llamapy.engine.engine import Engine
from llamapy.engine.lease_idle import lease_expiry_wait, reclaim_idle_leases, release_if_held
from llamapy.engine.request import CacheKey, Request
from llamapy.errors import (
    ClosedError,
    EngineError,
    LlamapyError,
    LoadFailedError,
    RuntimeDiedError,
)
from llamapy.runtime.commands import (
    Call,
    Cancel,
    Close,
    Lease,
    Submit,
    deliver_error,
    grant_leases,
    reject,
    run_call,
)
from llamapy.runtime.handles import AsyncHandle, EventHandle, SyncHandle
from llamapy.runtime.hosting import Hosted, LoopState
from llamapy.runtime.model_info import MediaEncoding, ModelInfo
from llamapy.runtime.prebuild import SamplerPrebuilder, costly_sampler
from llamapy.runtime.stall import StallWatch

__all__ = ["TickLoop"]

log = logging.getLogger("llamapy.runtime")
#: The longest timed wait on the inbox (a queue cannot wait for an infinite deadline).
_LONGEST_WAIT_S = 3600.0
T = TypeVar("T")


class TickLoop:
    """A threaded :class:`~llamapy.runtime.base.Runtime` (see the module docstring)."""

    def __init__(self, build: Callable[[], Hosted], thread_name: str = "llamapy-tick",
                 stall_timeout: float = 0.0) -> None:
        self.state = LoopState.LOADING
        self.load_error: LoadFailedError | None = None
        #: Why the thread died (state ``CRASHED``), else None.
        self.crash_error: RuntimeDiedError | None = None
        #: Called on the dying thread with the error once the loop has crashed and shut down.
        self.on_crash: list[Callable[[RuntimeDiedError], None]] = []
        self.hosted: Hosted | None = None
        #: Context tokens one sequence may use, known once the model is hosted (0 before).
        self.n_ctx_seq = 0
        #: Most tokens one decode takes (the engine's ``n_batch``; 0 before the load).
        self.n_batch = 0
        self.ready = threading.Event()
        self._build = build
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._leases: list[Lease] = []
        self._stall_timeout = stall_timeout
        self._stall: StallWatch | None = None
        self._prebuild = SamplerPrebuilder(self._backend, self._forward, self._max_queue)
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    # --- called from any thread ---------------------------------------------------------------

    @property
    def model(self) -> ModelInfo | None:
        """The hosted model (None while loading, after a failed load and once closed)."""
        hosted = self.hosted
        return None if hosted is None else hosted.model

    @property
    def media(self) -> MediaEncoding | None:
        """The hosted model's media encoder (None without one, or while not hosted)."""
        hosted = self.hosted
        return None if hosted is None else hosted.media

    def submit(self, request: Request) -> None:
        """Queue a request; errors reach its sink as an ``ErrorEvent``."""
        if self.state in (LoopState.CLOSED, LoopState.CRASHED):  # nobody would read it
            deliver_error(request, self.crash_error or ClosedError("runtime is closed"))
            return
        if self.state in (LoopState.LOADING, LoopState.READY) and costly_sampler(request):
            self._prebuild.submit(request)  # (a grammar's parse never stalls the tick)
            return
        self._inbox.put(Submit(request))
        self._answer_if_gone()

    def _max_queue(self) -> int:
        hosted = self.hosted
        return 0 if hosted is None else hosted.engine.config.max_queue

    def _backend(self) -> Any:
        """The backend once the load has ended (the sampler builder waits for it); the load's
        error if it failed; None once closed."""
        self.ready.wait()
        if self.load_error is not None:
            raise self.load_error
        hosted = self.hosted
        return None if hosted is None else hosted.engine.backend

    def _forward(self, request: Request, cancelled: bool) -> None:
        """A request whose sampler was built ahead, to the engine (then its cancel)."""
        self._inbox.put(Submit(request))
        if cancelled:
            self._inbox.put(Cancel(request.request_id))

    def cancel(self, request_id: Hashable) -> None:
        """Ask the engine to cancel a request (queued or running)."""
        self._prebuild.cancel(request_id)
        if self._thread.is_alive():
            self._inbox.put(Cancel(request_id))

    def call(self, fn: Callable[[Engine], T], timeout: float | None = 60.0) -> T:
        """Run ``fn(engine)`` on the tick thread between ticks and return its result. Past
        ``timeout`` a call still queued is withdrawn (``TimeoutError``: ``fn`` never ran); one
        the thread took meanwhile runs to its end and its result is returned."""
        result: T = self._command(lambda future: Call(fn, future), timeout)
        return result

    async def acall(self, fn: Callable[[Engine], T], timeout: float | None = 60.0) -> T:
        """:meth:`call` for a coroutine: the tick thread resolves the awaited future through
        the event loop (``call_soon_threadsafe``), no thread is blocked. ``TimeoutError``
        past ``timeout`` means ``fn`` never ran (as for :meth:`call`); a command still
        waiting in the inbox is also skipped when the awaiting task is cancelled."""
        future: Future[T] = Future()
        self._post(Call(fn, future))
        wrapped = asyncio.wrap_future(future)
        try:
            return await asyncio.wait_for(asyncio.shield(wrapped), timeout)
        except asyncio.TimeoutError:  # (not the builtin before Python 3.11)
            if not future.cancel():  # it started: it ends soon, and its result counts
                return await wrapped
            raise TimeoutError(f"runtime call did not finish within {timeout} s") from None
        except asyncio.CancelledError:
            future.cancel()
            raise

    def lease(self, key: CacheKey, timeout: float, *, idle_s: float | None = None,
              on_expire: Callable[[], None] | None = None) -> int:
        """Lease a slot, waiting up to ``timeout`` seconds for one (``LeaseTimeoutError``);
        ``idle_s``/``on_expire``: its idle bound (:mod:`llamapy.engine.lease_idle`)."""
        deadline = time.monotonic() + timeout
        return int(self._command(lambda future: Lease(key, deadline, future, idle_s,
                                                       on_expire), timeout + 30.0))

    def release(self, lease_id: int) -> None:
        """End a lease (nothing to do once the loop is closed)."""
        if self.state is LoopState.READY:
            self.call(lambda engine: engine.release(lease_id))

    def release_later(self, lease_id: int) -> None:
        """End a lease without waiting (any thread, a finalizer or interpreter exit included):
        the release is posted to the tick thread; a lease gone meanwhile is ignored."""
        if self.state is LoopState.READY:
            self._inbox.put(Call(lambda engine: release_if_held(engine, lease_id), Future()))

    def open_handle(self, request_id: Hashable,
                    loop: asyncio.AbstractEventLoop | None = None) -> EventHandle:
        """A blocking handle, or one read on ``loop``."""
        return SyncHandle(request_id) if loop is None else AsyncHandle(request_id, loop)

    def close(self, timeout: float | None = None) -> None:
        """Stop the loop: in-flight requests end with ``ClosedError``; resources are freed."""
        if self._thread.is_alive():
            self._inbox.put(Close())
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the tick thread is running."""
        return self._thread.is_alive()

    def _post(self, command: object) -> None:
        """Put a command carrying a future in the inbox (raise when nobody would answer)."""
        if self.state in (LoopState.CLOSED, LoopState.FAILED, LoopState.CRASHED):
            raise self.load_error or self.crash_error or ClosedError("runtime is not running")
        self._inbox.put(command)
        self._answer_if_gone()

    def _answer_if_gone(self) -> None:
        """After a put: if the loop ended meanwhile (closed, crashed, or a failed load's
        thread gone), nobody drains the inbox again, so answer what is there now."""
        if self.state in (LoopState.CLOSED, LoopState.CRASHED) or not self._thread.is_alive():
            self._reject_inbox()

    def _command(self, make: Callable[[Future[Any]], object], timeout: float | None) -> Any:
        future: Future[Any] = Future()
        self._post(make(future))
        try:
            return future.result(timeout)
        except FutureTimeoutError:
            if future.cancel():  # still waiting in the inbox: skipped, it never runs
                raise
            return future.result()  # it started on the tick thread: its result counts

    # --- tick thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.hosted = self._build()
            self.n_ctx_seq = self.hosted.engine.n_ctx_seq
            self.n_batch = self.hosted.engine.n_batch
        except Exception as exc:  # typed or foreign: never a stray thread death
            self._fail_load(exc)
            self._reject_until_closed()
            return
        self.state = LoopState.READY
        if self._stall_timeout > 0:
            self._stall = StallWatch(self._stall_timeout, self._stalled,
                                     progress=self.hosted.progress)
        self.ready.set()
        try:
            self._serve(self.hosted.engine)
        except BaseException as exc:  # a bug: never a live loop that answers nothing
            log.critical("the tick thread died", exc_info=exc)
            self.crash_error = RuntimeDiedError(exc)
        stalled = self._stall is not None and self._stall.fired
        if self._stall is not None:
            self._stall.close()
            self._stall = None  # (its progress reads the context: nothing may keep that)
        self._shutdown()
        if self.crash_error is not None and not stalled:  # (a stall was told when it came)
            self._notify_crash(self.crash_error)

    def _stalled(self, seconds: float) -> None:
        """On the watcher thread: the tick thread is stuck; the loop is dead from now on."""
        cause = TimeoutError(f"one tick or command has run for {seconds:.0f} s "
                             f"(stall_timeout {self._stall_timeout:g} s)")
        log.critical("the tick thread is stuck: %s", cause)
        self.crash_error = RuntimeDiedError(cause)
        self.state = LoopState.CRASHED
        self._notify_crash(self.crash_error)

    def _notify_crash(self, error: RuntimeDiedError) -> None:
        for callback in list(self.on_crash):
            try:
                callback(error)
            except Exception:
                log.exception("on_crash callback failed")

    def _fail_load(self, exc: BaseException) -> None:
        self.load_error = LoadFailedError(exc)
        self.state = LoopState.FAILED
        log.error("load failed: %s", exc)
        self.ready.set()

    def _serve(self, engine: Engine) -> None:
        while True:
            reclaim_idle_leases(engine)
            if self._leases:
                self._leases = grant_leases(engine, self._leases)
            busy = engine.has_work
            if not self._drain(engine, 0.0 if busy else self._idle_wait(engine)):
                return
            if busy or engine.has_work:  # (what the inbox brought may be work)
                self._begin()
                engine.tick(self._quiet)  # never raises but for a bug (the loop CRASHED)
                if self._end():
                    return

    def _quiet(self) -> bool:
        """Whether nothing waits for the engine (a steady decode may chain: no command in the
        inbox, no lease waiting for a slot)."""
        return self._inbox.empty() and not self._leases

    def _idle_wait(self, engine: Engine) -> float | None:
        """How long an idle loop may block: until the next lease deadline or lease expiry (on
        the engine's clock), else forever."""
        now, expiry = time.monotonic(), lease_expiry_wait(engine)
        waits = [p.deadline - now for p in self._leases] + ([] if expiry is None else [expiry])
        return min(max(0.0, min(waits)), _LONGEST_WAIT_S) if waits else None

    def _drain(self, engine: Engine, wait: float | None) -> bool:
        """Handle inbox commands (blocking up to ``wait`` for the first); False on close."""
        if wait == 0.0 and self._inbox.empty():  # the busy loop's usual case: no exception
            return True
        try:
            item = self._inbox.get(timeout=wait) if wait != 0.0 else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if not self._handle(engine, item):
                return False
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _begin(self) -> None:
        if self._stall is not None:
            self._stall.begin()

    def _end(self) -> bool:
        """The unit of work ended; True when it had stalled (the loop must end)."""
        if self._stall is None:
            return False
        self._stall.end()
        return self._stall.fired

    def _handle(self, engine: Engine, item: object) -> bool:
        """Carry out one command; False on close, or when it stalled (the loop is dead)."""
        self._begin()
        go_on = self._carry_out(engine, item)
        return not self._end() and go_on

    def _carry_out(self, engine: Engine, item: object) -> bool:
        """One command; a command that raises fails only itself."""
        try:
            return self._dispatch(engine, item)
        except Exception as exc:  # a bug: the command fails, the thread serves on
            log.exception("%s failed", type(item).__name__)
            if isinstance(item, Submit):
                if item.request.sampler is not None:
                    item.request.sampler.close()
                deliver_error(item.request, EngineError("submit", exc))
            return True

    def _dispatch(self, engine: Engine, item: object) -> bool:
        if isinstance(item, Submit):
            try:
                engine.submit(item.request)
            except LlamapyError as exc:
                deliver_error(item.request, exc)
        elif isinstance(item, Cancel):
            engine.cancel(item.request_id)
        elif isinstance(item, Call):
            run_call(engine, item)
        elif isinstance(item, Lease):
            self._leases.append(item)
        elif isinstance(item, Close):
            return False
        return True

    def _shutdown(self) -> None:
        self._prebuild.close()  # what it still forwards is rejected below
        self.state = LoopState.CLOSED if self.crash_error is None else LoopState.CRASHED
        hosted, self.hosted = self.hosted, None
        if hosted is not None:
            try:
                hosted.engine.close()
            except Exception:
                log.exception("engine close failed")
        self._reject_pending()
        if hosted is not None:
            hosted.free()

    def _reject_pending(self) -> None:
        for want in self._leases:
            if not want.future.cancelled():
                want.future.set_exception(ClosedError("runtime is closed"))
        self._leases = []
        self._reject_inbox()

    def _reject_inbox(self) -> None:
        """Answer every command left in the inbox with the loop's end (any thread: once
        closed, a command put after the tick thread's last drain is answered here)."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._reject(item)

    def _reject_until_closed(self) -> None:
        """After a failed load: answer every command with the load error until close."""
        while True:
            item = self._inbox.get()
            if isinstance(item, Close):
                self._prebuild.close()
                self._reject_pending()
                return
            self._reject(item)

    def _reject(self, item: object) -> None:
        reject(item, self.load_error or self.crash_error or ClosedError("runtime is closed"))
