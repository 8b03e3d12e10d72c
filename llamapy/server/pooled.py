"""Pooled outputs of a ``Server`` whose model pools its input (a reranker): the scores of
``score_tokens`` / ``ascore_tokens`` and the outputs of ``pool_tokens`` / ``apool_tokens``.

Each input is one pooled request to the engine (:attr:`~llamapy.engine.Request.pooled`), so
the engine batches the inputs of every call in flight together, each prompt whole, under its
``n_batch`` budget and batch strategy, on the server's slots. A call keeps at most
``n_parallel`` of its inputs in the engine at once (queued or on a slot): each input that
ends submits the next one from the tick thread, before the next tick, so a call of 2,000
documents holds no more of the bounded queue than a call of four, and calls made together
share the slots. The queue bound and the tenant's request bound refuse a call only at its
first input (``QueueFullError``, ``TenantBusyError``); a later input they refuse waits in the
server's backlog and is submitted again when any pooled input ends (one always does: the
queue was full, or the tenant busy, with inputs that will end). Every input is checked
before the first is submitted (token ids, length: ``ContextOverflowError`` past
:attr:`PooledMethods.max_pooled_tokens`). The first input that fails fails the call and
cancels the rest; so do a timeout (:class:`~llamapy.errors.RequestTimeoutError`) and
cancelling the awaiting task.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence

from ..engine import Request, RequestOptions
from ..engine.request import DoneEvent, ErrorEvent, Event
from ..errors import (
    ContextOverflowError,
    EngineError,
    InvalidOptionError,
    LlamapyError,
    QueueFullError,
    RequestCancelledError,
    RequestTimeoutError,
)
from ..runtime import TickLoop
from .core import ServerCore
from .options import DEFAULT_CALL_TIMEOUT

__all__ = ["PooledBacklog", "PooledCall", "PooledMethods"]

log = logging.getLogger("llamapy.server")
_CALLS = itertools.count()
_BACKLOG_LOCK = threading.Lock()


class PooledBacklog:
    """Inputs the engine refused for a full queue or a busy tenant, each submitted again
    when a pooled input ends (one per ending, in the order they were refused; one refused
    again goes to the back, so a busy tenant's input does not hold up another's). Releases
    never nest: a release whose submit is answered at once (a closed loop answers every
    submit with its end) is run by the outermost one, in a loop. Each refusal counts in the
    engine's ``num_rejected``, a retry's too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: deque[tuple[PooledCall, int]] = deque()
        self._owed = 0
        self._releasing = False

    def park(self, call: PooledCall, index: int) -> None:
        """Keep ``call``'s input ``index`` until an input ends."""
        with self._lock:
            self._waiting.append((call, index))

    def release_one(self) -> None:
        """Submit the first parked input of a call still running."""
        with self._lock:
            self._owed += 1
            if self._releasing:
                return
            self._releasing = True
        while True:
            with self._lock:
                if not self._owed:
                    self._releasing = False
                    return
                self._owed -= 1
            self._release()

    def _release(self) -> None:
        while True:
            with self._lock:
                if not self._waiting:
                    return
                call, index = self._waiting.popleft()
            if call.resubmit(index):
                return

    def __len__(self) -> int:
        return len(self._waiting)


class PooledCall:
    """The inputs of one call, submitted ``window`` at a time (see the module docstring);
    ``on_end`` runs once, on whichever thread ends the call."""

    def __init__(self, loop: TickLoop, inputs: list[list[int]], window: int,
                 options: RequestOptions, backlog: PooledBacklog,
                 on_end: Callable[[], None]) -> None:
        self.outputs: list[tuple[float, ...]] = [() for _ in inputs]
        self.error: LlamapyError | None = None
        self._loop, self._inputs, self._options = loop, inputs, options
        self._window, self._backlog, self._on_end = max(1, window), backlog, on_end
        self._call = next(_CALLS)
        self._lock = threading.Lock()
        self._next = 0
        self._left = len(inputs)
        self._active: set[Hashable] = set()
        self._ended = False

    def start(self) -> None:
        """Submit the first window of inputs (the call ends at once when there are none)."""
        if not self._inputs:
            self._end()
        for _ in range(min(self._window, len(self._inputs))):
            self._submit_next()

    def cancel(self, error: LlamapyError | None = None) -> None:
        """End the call with ``error`` (default: cancelled), cancelling its inputs in flight."""
        with self._lock:
            if self.error is None:
                self.error = error or RequestCancelledError("the call was cancelled")
            active, self._active = list(self._active), set()
        for request_id in active:
            self._loop.cancel(request_id)
        self._end()

    def resubmit(self, index: int) -> bool:
        """Submit input ``index`` again (refused before); False when the call has ended."""
        with self._lock:
            if self.error is not None:
                return False
        self._submit(index)
        return True

    def _submit_next(self) -> None:
        with self._lock:
            if self.error is not None or self._next >= len(self._inputs):
                return
            index, self._next = self._next, self._next + 1
        self._submit(index)

    def _submit(self, index: int) -> None:
        request_id = ("pooled", self._call, index)
        with self._lock:
            self._active.add(request_id)
        self._loop.submit(Request(request_id, self._inputs[index], self._options,
                                  self._sink(index), pooled=True))
        with self._lock:  # a cancel that came meanwhile went ahead of this submit: again
            late = self.error is not None
        if late:
            self._loop.cancel(request_id)

    def _sink(self, index: int) -> Callable[[Event], None]:
        def sink(event: Event) -> None:
            try:
                self._on_event(index, event)
            except Exception as exc:  # (a bug here must end the call, never strand it)
                log.exception("pooled call %d: input %d", self._call, index)
                self.cancel(EngineError("pool", exc))
                self._backlog.release_one()
        return sink

    def _on_event(self, index: int, event: Event) -> None:
        if isinstance(event, ErrorEvent) and isinstance(event.exc, QueueFullError) \
                and index > 0:  # (a full queue or a busy tenant: later, not never)
            with self._lock:
                self._active.discard(event.request_id)
                ended = self.error is not None
            if not ended:
                self._backlog.park(self, index)
            return
        if not isinstance(event, DoneEvent | ErrorEvent):
            return
        more = False
        if isinstance(event, DoneEvent) and event.pooled is not None:
            more = self._done(index, event)
        else:  # an error, or cancelled: the call ends
            self.cancel(event.exc if isinstance(event, ErrorEvent) else None)
        self._backlog.release_one()  # (an input ended: its place goes to a parked one first)
        if more:
            self._submit_next()

    def _done(self, index: int, event: DoneEvent) -> bool:
        """Record an input's output; whether more inputs are to be submitted."""
        assert event.pooled is not None
        with self._lock:
            self._active.discard(event.request_id)
            self.outputs[index] = event.pooled
            self._left -= 1
            last = self._left == 0
        if last:
            self._end()
        return not last

    def _end(self) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._on_end()


class PooledMethods(ServerCore):
    """The pooled calls of :class:`~llamapy.server.Server` (see the module docstring)."""

    _pooled_backlog: PooledBacklog | None = None

    @property
    def max_pooled_tokens(self) -> int:
        """The longest input a pooled call takes (one decode; 0 while the model loads)."""
        return min(self._loop.n_batch, self._loop.n_ctx_seq)

    def pool_tokens(self, inputs: Sequence[Sequence[int]], *, tenant: str | None = None,
                    timeout: float | None = DEFAULT_CALL_TIMEOUT) -> list[tuple[float, ...]]:
        """Each input's pooled output (a reranker's classifier outputs), blocking; the model
        must pool (``UnsupportedFeatureError``). ``tenant``: whom the inputs are accounted
        to; ``timeout`` bounds the whole call, the wait for the load included."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait_loaded(timeout, timeout)
        ended = threading.Event()
        call = self._pooled_call(inputs, tenant, ended.set)
        call.start()
        if not ended.wait(_left(deadline)):
            call.cancel(RequestTimeoutError(f"pooling timed out after {timeout} s"))
        return _outputs(call)

    def score_tokens(self, inputs: Sequence[Sequence[int]], *, tenant: str | None = None,
                     timeout: float | None = DEFAULT_CALL_TIMEOUT) -> list[float]:
        """Each input's relevance score (the first output of a reranker's classifier head,
        unnormalised), blocking; see :meth:`pool_tokens`."""
        return [out[0] for out in self.pool_tokens(inputs, tenant=tenant, timeout=timeout)]

    async def apool_tokens(self, inputs: Sequence[Sequence[int]], *, tenant: str | None = None,
                           timeout: float | None = DEFAULT_CALL_TIMEOUT
                           ) -> list[tuple[float, ...]]:
        """:meth:`pool_tokens`, awaited; cancelling the task cancels the inputs in flight."""
        deadline = None if timeout is None else time.monotonic() + timeout
        await self._await_loaded(timeout, timeout)
        loop = asyncio.get_running_loop()
        ended = loop.create_future()

        def end() -> None:
            with contextlib.suppress(RuntimeError):  # (the caller's loop closed meanwhile)
                loop.call_soon_threadsafe(_settle, ended)

        call = self._pooled_call(inputs, tenant, end)
        call.start()
        try:
            await asyncio.wait_for(asyncio.shield(ended), _left(deadline))
        except asyncio.TimeoutError:
            call.cancel(RequestTimeoutError(f"pooling timed out after {timeout} s"))
        except asyncio.CancelledError:
            call.cancel()
            raise
        return _outputs(call)

    async def ascore_tokens(self, inputs: Sequence[Sequence[int]], *,
                            tenant: str | None = None,
                            timeout: float | None = DEFAULT_CALL_TIMEOUT) -> list[float]:
        """:meth:`score_tokens`, awaited."""
        outputs = await self.apool_tokens(inputs, tenant=tenant, timeout=timeout)
        return [out[0] for out in outputs]

    def _pooled_call(self, inputs: Sequence[Sequence[int]], tenant: str | None,
                     on_end: Callable[[], None]) -> PooledCall:
        """The call of ``inputs`` (each checked now, see :func:`_checked`)."""
        engine = self._start.engine
        checked = _checked(inputs, self.fetch_model().n_vocab, self.max_pooled_tokens)
        window = engine.n_parallel
        if engine.tenant_max_requests > 0:  # (more would wait in the backlog)
            window = min(window, engine.tenant_max_requests)
        with _BACKLOG_LOCK:
            if self._pooled_backlog is None:
                self._pooled_backlog = PooledBacklog()
        return PooledCall(self._loop, checked, window,
                          RequestOptions(max_tokens=0, tenant=tenant), self._pooled_backlog,
                          on_end)


def _checked(inputs: Sequence[Sequence[int]], n_vocab: int, longest: int) -> list[list[int]]:
    """Each input as a list of ints: ``InvalidOptionError`` for one that is empty or holds
    anything but token ids in ``[0, n_vocab)``, ``ContextOverflowError`` past ``longest``."""
    out = []
    for ids in inputs:
        try:
            tokens = list(map(operator.index, ids))
        except TypeError as exc:
            raise InvalidOptionError("each input must be a sequence of token ids",
                                     option="inputs") from exc
        if not tokens or min(tokens) < 0 or max(tokens) >= n_vocab:
            raise InvalidOptionError(f"each input must hold token ids in [0, {n_vocab})",
                                     option="inputs")
        if len(tokens) > longest:
            raise ContextOverflowError(stage="pool", resident_tokens=0,
                                       additional_tokens=len(tokens), n_ctx=longest)
        out.append(tokens)
    return out


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _outputs(call: PooledCall) -> list[tuple[float, ...]]:
    if call.error is not None:
        raise call.error
    return call.outputs
