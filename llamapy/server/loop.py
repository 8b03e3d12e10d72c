"""The tick thread: the one thread that owns the model, the context and the engine.

Other threads talk to it only through its inbox (a blocking queue of commands). With no work
the thread blocks on the inbox (idle is ~0% CPU); with work it drains the inbox between ticks.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from .._native import Context, Model
from ..engine import Engine, ErrorEvent, Request, RequestTimings
from ..errors import ClosedError, LlamapyError, LoadFailedError
from ..llama_backend import LlamaBackend
from .options import ResolvedStart

log = logging.getLogger("llamapy.server")


class LoopState(enum.Enum):
    """Lifecycle of the tick thread."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


@dataclass(slots=True)
class _Submit:
    request: Request


@dataclass(slots=True)
class _Cancel:
    request_id: Any


@dataclass(slots=True)
class _Call:
    fn: Callable[[TickLoop], Any]
    future: Future[Any]


class _Close:
    pass


class TickLoop:
    """Loads the model in its own thread, then runs the engine's tick loop."""

    def __init__(self, start: ResolvedStart, thread_name: str = "llamapy-server") -> None:
        self.start = start
        self.state = LoopState.LOADING
        self.load_error: LoadFailedError | None = None
        self.model: Model | None = None
        self.ctx: Context | None = None
        self.backend: LlamaBackend | None = None
        self.engine: Engine | None = None
        self.ready = threading.Event()
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    # --- called from any thread ---------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queue a request; errors reach its sink as an ``ErrorEvent``."""
        self._inbox.put(_Submit(request))

    def cancel(self, request_id: Any) -> None:
        """Ask the engine to cancel a request (queued or running)."""
        self._inbox.put(_Cancel(request_id))

    def call(self, fn: Callable[[TickLoop], Any]) -> Future[Any]:
        """Run ``fn(loop)`` on the tick thread between ticks; the future holds its result."""
        future: Future[Any] = Future()
        if self.state in (LoopState.CLOSED, LoopState.FAILED):
            future.set_exception(ClosedError("server is not running"))
        else:
            self._inbox.put(_Call(fn, future))
        return future

    def close(self, timeout: float | None = None) -> None:
        """Stop the loop: in-flight requests end with ``ClosedError``; resources are freed."""
        if self._thread.is_alive():
            self._inbox.put(_Close())
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the tick thread is running."""
        return self._thread.is_alive()

    # --- tick thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._load()
        except LlamapyError as exc:
            self._fail_load(exc)
        except Exception as exc:  # a foreign error while loading: never a stray thread death
            self._fail_load(exc)
        else:
            self.state = LoopState.READY
            self.ready.set()
            try:
                self._serve()
            finally:
                self._shutdown()
        if self.state is LoopState.FAILED:
            self._reject_until_closed()

    def _load(self) -> None:
        start = self.start
        self.model = Model(start.server.model_path, start.model)
        self.ctx = Context(self.model, start.context)
        self.backend = LlamaBackend(self.model, self.ctx)
        self.backend.load_adapters(tuple((path, 1.0) for path in start.server.lora))
        self.engine = Engine(self.backend, start.engine)

    def _fail_load(self, exc: BaseException) -> None:
        self.load_error = LoadFailedError(exc)
        self.state = LoopState.FAILED
        log.error("model load failed: %s", exc)
        self._free_native()
        self.ready.set()

    def _serve(self) -> None:
        engine = self.engine
        assert engine is not None
        while True:
            block = not engine.has_work
            if not self._drain(block):
                return
            if engine.has_work:
                try:
                    engine.tick()
                except Exception:  # the engine failed its own requests; keep serving
                    log.exception("tick failed")

    def _drain(self, block: bool) -> bool:
        """Handle inbox commands; False when asked to close."""
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if not self._handle(item):
                return False
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _handle(self, item: object) -> bool:
        engine = self.engine
        assert engine is not None
        if isinstance(item, _Submit):
            try:
                self._load_adapters(item.request)
                engine.submit(item.request)
            except LlamapyError as exc:
                _deliver_error(item.request, exc)
        elif isinstance(item, _Cancel):
            engine.cancel(item.request_id)
        elif isinstance(item, _Call):
            if item.future.set_running_or_notify_cancel():
                try:
                    item.future.set_result(item.fn(self))
                except BaseException as exc:
                    item.future.set_exception(exc)
        elif isinstance(item, _Close):
            return False
        return True

    def _load_adapters(self, request: Request) -> None:
        """Load the request's LoRA adapters here, on the tick thread (once per server)."""
        if request.adapter_set:
            assert self.backend is not None
            self.backend.load_adapters(request.adapter_set)

    def _shutdown(self) -> None:
        self.state = LoopState.CLOSED
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception:
                log.exception("engine close failed")
        self._reject_pending()
        self._free_native()

    def _reject_pending(self) -> None:
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
            if isinstance(item, _Close):
                self._reject_pending()
                return
            self._reject(item)

    def _reject(self, item: object) -> None:
        error: LlamapyError = self.load_error or ClosedError("server is closed")
        if isinstance(item, _Submit):
            _deliver_error(item.request, error)
        elif isinstance(item, _Call) and item.future.set_running_or_notify_cancel():
            item.future.set_exception(error)

    def _free_native(self) -> None:
        """Context first, then the adapters it used, then the model."""
        if self.ctx is not None:
            self.ctx.close()
        if self.backend is not None:
            self.backend.close()
        if self.model is not None:
            self.model.close()


def _deliver_error(request: Request, exc: LlamapyError) -> None:
    try:
        request.sink(ErrorEvent(request.request_id, exc, RequestTimings()))
    except Exception:
        log.exception("request sink failed")
