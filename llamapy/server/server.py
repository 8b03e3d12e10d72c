"""``Server``: continuous-batching generation on one model, with a sync and an asyncio API.

A dedicated thread loads the model and runs the engine's tick loop; every public method is
thread-safe and talks to it through its inbox. See ``../shared/seeds`` for the API this mirrors.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from .._native import Model
from ..engine import DoneEvent, ErrorEvent, Request, TokenEvent, resolve_request_options
from ..errors import (
    LlamapyError,
    NotReadyError,
    NotRunningError,
    RequestTimeoutError,
    UnknownOptionError,
)
from .adapters import resolve_adapters
from .handles import AsyncHandle, Collector, Completion, SyncHandle, raise_for
from .loop import LoopState, TickLoop
from .options import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_STREAM_TIMEOUT,
    ResolvedStart,
    call_option_keys,
    resolve_start_options,
)

_ids = itertools.count(1)


class Server:
    """Serve one GGUF model to many concurrent callers.

    ``Server(model_path, **options)`` returns at once; the model loads in the background
    (:meth:`fetch_model` reports progress, :meth:`wait_ready` blocks). Options and defaults are
    those of :func:`~llamapy.server.start_option_keys`: ``n_ctx`` 8192 shared across slots,
    ``n_parallel`` 4, ``n_batch`` ``min(n_ctx, 2048)``, ``chunk_size`` 512, ``max_queue`` 64
    (0 = unlimited), ``cache_prompt`` True, ``kv_unified`` True, ``prompt_cache_ram_mb`` 0,
    ``batch_strategy`` ``"decode_maximal"``, sampling defaults, context tuning and model loading
    options (``n_threads`` defaults to the physical core count).

    Per request, ``adapters`` runs it under a LoRA adapter set (see
    :func:`~llamapy.server.adapters.resolve_adapters`): files are loaded once per server on the
    tick thread; requests of different sets never share a decode call or reuse each other's KV.

    Use as a context manager or call :meth:`close`: in-flight requests then end with
    :class:`~llamapy.errors.ClosedError`, the thread joins and native memory is freed.
    """

    def __init__(self, model_path: str | os.PathLike[str], **options: Any) -> None:
        self._start = resolve_start_options(model_path, options)
        self.model_path = self._start.server.model_path
        self._loop = TickLoop(self._start, thread_name=self._start.server.name or "llamapy-server")
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------

    def fetch_model(self) -> Model | LlamapyError:
        """The model, or the typed reason it is unavailable (no round trip to the tick thread).

        Returns :class:`NotReadyError` while loading, :class:`LoadFailedError` after a failed
        load, :class:`NotRunningError` once closed.
        """
        state = self._loop.state
        if self._closed or state is LoopState.CLOSED:
            return NotRunningError("server is not running")
        if state is LoopState.FAILED:
            assert self._loop.load_error is not None
            return self._loop.load_error
        if state is LoopState.LOADING or self._loop.model is None:
            return NotReadyError("server is still loading its model")
        return self._loop.model

    @property
    def model(self) -> Model:
        """The model; raises the typed error :meth:`fetch_model` would return."""
        result = self.fetch_model()
        if isinstance(result, LlamapyError):
            raise result
        return result

    def wait_ready(self, timeout: float | None = None) -> Server:
        """Block until the model is loaded; raise :class:`LoadFailedError` if it failed."""
        if not self._loop.ready.wait(timeout):
            raise NotReadyError("server is still loading its model")
        self.model  # noqa: B018 - raises LoadFailedError / NotRunningError
        return self

    @property
    def ready(self) -> bool:
        """Whether the model is loaded and the server accepts work."""
        return self._loop.state is LoopState.READY and not self._closed

    @property
    def start_options(self) -> ResolvedStart:
        """The resolved start options, split by owner (server, engine, context, model)."""
        return self._start

    @property
    def lora_adapters(self) -> tuple[str, ...]:
        """The LoRA adapter files loaded at start (select them by index)."""
        return self._start.server.lora

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop serving; idempotent."""
        self._closed = True
        self._loop.close(timeout)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- requests -----------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True
                 ) -> list[int]:
        """Tokenize with the served model (waits for the load)."""
        return self.wait_ready().model.tokenize(text, add_special, parse_special)

    def _request(self, token_ids: Sequence[int], options: dict[str, Any], sink: Any,
                 **extra: Any) -> Request:
        unknown = set(options) - set(call_option_keys())
        if unknown:
            raise UnknownOptionError(unknown, call_option_keys(), where="request")
        opts = {k: v for k, v in options.items() if k != "timeout"}
        if "adapters" in opts:
            opts["adapters"] = resolve_adapters(opts["adapters"])
        resolved = resolve_request_options(opts, defaults=self._start.engine.sampling)
        return Request(request_id=next(_ids), token_ids=list(token_ids), options=resolved,
                       sink=sink, **extra)

    def _check_running(self) -> None:
        state = self._loop.state
        if self._closed or state is LoopState.CLOSED:
            raise NotRunningError("server is not running")
        if state is LoopState.FAILED:
            assert self._loop.load_error is not None
            raise self._loop.load_error

    def submit(self, token_ids: Sequence[int], sink: Any, **options: Any) -> Any:
        """Low-level: submit a request whose events go to ``sink``; returns its request id.

        Used by the blocking/async calls below and by :class:`~llamapy.session.Session`.
        Raises at once for unknown or invalid options and for a missing ``adapters`` file
        (``ModelLoadError``); later errors arrive at ``sink`` as an ``ErrorEvent``.
        """
        self._check_running()
        request = self._request(token_ids, options, sink)
        self._loop.submit(request)
        return request.request_id

    def submit_request(self, request: Request) -> None:
        """Low-level: submit a fully built engine request (its ``options.adapters`` as built by
        :func:`~llamapy.server.adapters.resolve_adapters`)."""
        self._check_running()
        self._loop.submit(request)

    def cancel(self, request_id: Any) -> None:
        """Cancel a queued or running request; its consumer sees ``CancelledError``."""
        if self._loop.alive:
            self._loop.cancel(request_id)

    def complete_tokens(self, token_ids: Sequence[int], **options: Any) -> Completion:
        """Generate from tokens; return the text with completion metadata.

        ``timeout`` (default 60 s) bounds the whole call; past it the request is cancelled and
        :class:`~llamapy.errors.RequestTimeoutError` raised.
        """
        timeout = options.get("timeout", DEFAULT_CALL_TIMEOUT)
        collector = Collector(len(token_ids))
        for event in self._events(token_ids, options, per_event=False, timeout=timeout):
            if isinstance(event, TokenEvent):
                collector.add(event)
            elif isinstance(event, DoneEvent):
                return collector.finish(event)
        raise AssertionError("request ended without a final event")

    def complete(self, prompt: str, **options: Any) -> Completion:
        """Like :meth:`complete_tokens`, from text."""
        return self.complete_tokens(self.tokenize(prompt), **options)

    def generate_tokens(self, token_ids: Sequence[int], **options: Any) -> str:
        """Generate text from tokens (blocking)."""
        return self.complete_tokens(token_ids, **options).text

    def generate(self, prompt: str, **options: Any) -> str:
        """Generate text from a prompt (blocking). Options: see ``request_option_keys()``."""
        return self.complete(prompt, **options).text

    def stream_tokens(self, token_ids: Sequence[int], **options: Any) -> Iterator[str]:
        """Iterate over text chunks as they are generated.

        ``timeout`` (default 30 s) is per chunk. Errors (queue full, failure, timeout) raise
        from the iterator where they happen; closing the iterator early cancels the request.
        """
        timeout = options.get("timeout", DEFAULT_STREAM_TIMEOUT)
        for event in self._events(token_ids, options, per_event=True, timeout=timeout):
            if isinstance(event, TokenEvent) and event.text:
                yield event.text

    def stream(self, prompt: str, **options: Any) -> Iterator[str]:
        """Like :meth:`stream_tokens`, from text."""
        return self.stream_tokens(self.tokenize(prompt), **options)

    def events(self, token_ids: Sequence[int], **options: Any) -> Iterator[TokenEvent | DoneEvent]:
        """Iterate over the raw engine events (tokens with logprobs, then the final event)."""
        timeout = options.get("timeout", DEFAULT_STREAM_TIMEOUT)
        yield from self._events(token_ids, options, per_event=True, timeout=timeout)

    def _events(self, token_ids: Sequence[int], options: dict[str, Any], *, per_event: bool,
                timeout: float | None) -> Iterator[Any]:
        handle = SyncHandle()
        wait = _Wait(self.submit(token_ids, handle.sink, **options), timeout, per_event)
        try:
            while not wait.done:
                try:
                    event = handle.get(wait.budget())
                except queue.Empty:
                    raise wait.expired() from None
                yield wait.seen(event)
        finally:
            if not wait.done:
                handle.gone = True
                self.cancel(wait.request_id)

    # --- asyncio ------------------------------------------------------------------------------

    async def acomplete_tokens(self, token_ids: Sequence[int], **options: Any) -> Completion:
        """Async :meth:`complete_tokens`; cancelling the task cancels the request."""
        timeout = options.get("timeout", DEFAULT_CALL_TIMEOUT)
        collector = Collector(len(token_ids))
        async for event in self._aevents(token_ids, options, per_event=False, timeout=timeout):
            if isinstance(event, TokenEvent):
                collector.add(event)
            elif isinstance(event, DoneEvent):
                return collector.finish(event)
        raise AssertionError("request ended without a final event")

    async def acomplete(self, prompt: str, **options: Any) -> Completion:
        """Async :meth:`complete`."""
        return await self.acomplete_tokens(await self._atokenize(prompt), **options)

    async def agenerate(self, prompt: str, **options: Any) -> str:
        """Async :meth:`generate`."""
        return (await self.acomplete(prompt, **options)).text

    async def astream_tokens(self, token_ids: Sequence[int], **options: Any
                             ) -> AsyncIterator[str]:
        """Async :meth:`stream_tokens` (an async iterator of text chunks)."""
        timeout = options.get("timeout", DEFAULT_STREAM_TIMEOUT)
        async for event in self._aevents(token_ids, options, per_event=True, timeout=timeout):
            if isinstance(event, TokenEvent) and event.text:
                yield event.text

    async def astream(self, prompt: str, **options: Any) -> AsyncIterator[str]:
        """Async :meth:`stream`."""
        async for chunk in self.astream_tokens(await self._atokenize(prompt), **options):
            yield chunk

    async def aevents(self, token_ids: Sequence[int], **options: Any
                      ) -> AsyncIterator[TokenEvent | DoneEvent]:
        """Async :meth:`events`."""
        timeout = options.get("timeout", DEFAULT_STREAM_TIMEOUT)
        async for event in self._aevents(token_ids, options, per_event=True, timeout=timeout):
            yield event

    async def _atokenize(self, prompt: str) -> list[int]:
        if not self._loop.ready.is_set():
            await asyncio.get_running_loop().run_in_executor(None, self._loop.ready.wait)
        return self.model.tokenize(prompt, True, True)

    async def _aevents(self, token_ids: Sequence[int], options: dict[str, Any], *,
                       per_event: bool, timeout: float | None) -> AsyncIterator[Any]:
        handle = AsyncHandle(asyncio.get_running_loop())
        wait = _Wait(self.submit(token_ids, handle.sink, **options), timeout, per_event)
        try:
            while not wait.done:
                try:
                    event = await handle.get(wait.budget())
                except (TimeoutError, asyncio.TimeoutError):
                    raise wait.expired() from None
                yield wait.seen(event)
        finally:
            if not wait.done:
                handle.gone = True
                self.cancel(wait.request_id)

    # --- introspection ------------------------------------------------------------------------

    def stats(self, timeout: float = 10.0) -> dict[str, Any]:
        """A snapshot of the server: slots by state, queue depth, cache and token counters."""
        self._check_running()
        if not self._loop.ready.is_set():
            return {"state": self._loop.state.value}
        stats = self._loop.call(_engine_stats).result(timeout)
        return {"state": self._loop.state.value, **stats}

    def slots(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Each slot's state, cached tokens, scope, session, lease and current request."""
        return list(self.stats(timeout).get("slots", []))

    def call_on_loop(self, fn: Any, timeout: float | None = 60.0) -> Any:
        """Run ``fn(loop)`` on the tick thread between ticks (for sessions and snapshots)."""
        self._check_running()
        self.wait_ready()
        return self._loop.call(fn).result(timeout)

    def open_session(self, config: Any = None) -> Any:
        """Open a workspace :class:`~llamapy.session.Session` on a leased slot of this server
        (waits up to ``config.lease_timeout`` for a free slot, then ``LeaseTimeoutError``)."""
        from ..session import ServerHost, Session, SessionConfig, check_shared

        config = config or SessionConfig()
        check_shared(config)
        self._check_running()
        return Session(ServerHost(self, self._start, config.adapters), config)

    def __repr__(self) -> str:
        return f"<Server {os.path.basename(self.model_path)} {self._loop.state.value}>"


def _engine_stats(loop: TickLoop) -> dict[str, Any]:
    assert loop.engine is not None  # the loop is ready
    return loop.engine.stats().as_dict()


class _Wait:
    """The waiting side of one request, shared by the sync and async event loops: the time
    budget (per event, or one deadline for the whole call) and what the final event means."""

    __slots__ = ("deadline", "done", "request_id", "timeout")

    def __init__(self, request_id: Any, timeout: float | None, per_event: bool) -> None:
        self.request_id = request_id
        self.timeout = timeout
        self.deadline = None if per_event or timeout is None else time.monotonic() + timeout
        self.done = False

    def budget(self) -> float | None:
        """Seconds to wait for the next event."""
        if self.deadline is None:
            return self.timeout
        return max(0.0, self.deadline - time.monotonic())

    def expired(self) -> RequestTimeoutError:
        """The error for a wait that ran out (the caller's ``finally`` cancels)."""
        return RequestTimeoutError(f"request {self.request_id} timed out after {self.timeout} s")

    def seen(self, event: Any) -> Any:
        """Record ``event``; a final one ends the wait and raises its typed error, if any."""
        if isinstance(event, (DoneEvent, ErrorEvent)):
            self.done = True
            raise_for(event)
        return event
