"""``Server``: continuous-batching generation on one model, with a sync and an asyncio API.

A dedicated thread (:class:`~llamapy.runtime.loop.TickLoop`) loads the model and runs the
engine's tick loop; every public method is thread-safe and talks to it through the runtime.
Requests are read through the one event client (:mod:`llamapy.runtime.client`). See
``../shared/seeds`` for the API this mirrors.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar

from .._native import Model
from ..adapters import resolve_adapters
from ..engine import Engine, Request, StreamEvent, resolve_request_options
from ..errors import (
    InvalidOptionError,
    LlamapyError,
    NotReadyError,
    NotRunningError,
    UnknownOptionError,
)
from ..options.limits import check_limits
from ..runtime import (
    AsyncRequestStream,
    AsyncTextChunks,
    Collector,
    Completion,
    Hosted,
    LoopState,
    RequestStream,
    TextChunks,
    TickLoop,
    new_request_id,
)
from .loop import load_server
from .options import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_STREAM_TIMEOUT,
    ResolvedStart,
    call_option_keys,
    resolve_start_options,
)

T = TypeVar("T")


class Server:
    """Serve one GGUF model to many concurrent callers.

    ``Server(model_path, **options)`` returns at once; the model loads in the background
    (:meth:`fetch_model` reports progress, :meth:`wait_ready` blocks). Options and defaults are
    those of :func:`~llamapy.server.start_option_keys`: ``n_ctx`` 8192 shared across slots,
    ``n_parallel`` 4, ``n_batch`` ``min(n_ctx, 2048)``, ``chunk_size`` 512, ``max_queue`` 64
    (0 = unlimited), ``cache_prompt`` True, ``kv_unified`` True, ``prompt_cache_ram_mb`` 0,
    ``prompt_cache_dir`` None (the disk prompt cache: kept across restarts; closing the server
    writes its slots' and RAM cache's prefixes there), ``batch_strategy``
    ``"decode_maximal"``, sampling defaults, context tuning and model loading options
    (``n_threads`` defaults to the physical core count).

    Per request, ``adapters`` runs it under a LoRA adapter set (see
    :func:`~llamapy.server.adapters.resolve_adapters`): files are loaded once per server on the
    tick thread; requests of different sets never share a decode call or reuse each other's KV.

    Use as a context manager or call :meth:`close`: in-flight requests then end with
    :class:`~llamapy.errors.ClosedError`, the thread joins and the context is freed. The model
    is reference-counted: one obtained from :meth:`fetch_model` stays usable (tokenize,
    metadata) after ``close`` until its last holder drops it.

    Every generation call takes ``request_id`` (any hashable; default: a fresh id) so another
    thread can :meth:`cancel` it; streams also carry their ``request_id``.
    """

    def __init__(self, model_path: str | os.PathLike[str], **options: Any) -> None:
        self._open(load_server, model_path, options)

    @classmethod
    def hosting(cls, build: Callable[[ResolvedStart], Hosted],
                model_path: str | os.PathLike[str], **options: Any) -> Server:
        """A server whose tick thread hosts what ``build(start options)`` returns instead of
        loading ``model_path`` with libllama (the fake backend:
        :func:`llamapy.server.fake.fake_server`). ``options`` are validated as for
        ``Server(model_path, **options)``; a ``build`` that raises fails the load."""
        server = cls.__new__(cls)
        server._open(build, model_path, options)
        return server

    def _open(self, build: Callable[[ResolvedStart], Hosted],
              model_path: str | os.PathLike[str], options: dict[str, Any]) -> None:
        self._start = start = resolve_start_options(model_path, options)
        self.model_path = start.server.model_path
        self._loop = TickLoop(lambda: build(start),
                              thread_name=start.server.name or "llamapy-server")
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------

    def fetch_model(self) -> Model | LlamapyError:
        """The model, or the typed reason it is unavailable (no round trip to the tick thread).

        Returns :class:`NotReadyError` while loading, :class:`LoadFailedError` after a failed
        load, :class:`NotRunningError` once closed.
        """
        state = self._loop.state
        if state is LoopState.CRASHED and self._loop.crash_error is not None:
            return self._loop.crash_error
        if self._closed or state is LoopState.CLOSED:
            return NotRunningError("server is not running")
        if state is LoopState.FAILED:
            assert self._loop.load_error is not None
            return self._loop.load_error
        model = self._loop.model
        if state is LoopState.LOADING or model is None:
            return NotReadyError("server is still loading its model")
        return model  # type: ignore[no-any-return]

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
    def runtime(self) -> TickLoop:
        """The runtime that owns this server's engine (for sessions and tools)."""
        return self._loop

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

    def _request(self, token_ids: Sequence[int], options: dict[str, Any]) -> Request:
        unknown = set(options) - set(call_option_keys())
        if unknown:
            raise UnknownOptionError(unknown, call_option_keys(), where="request")
        opts = {k: v for k, v in options.items() if k not in ("timeout", "request_id")}
        if "adapters" in opts:
            opts["adapters"] = resolve_adapters(opts["adapters"])
        resolved = resolve_request_options(opts, defaults=self._start.engine.sampling)
        check_limits(resolved, self._start.engine)  # at the edge: the engine checks again
        request_id = options.get("request_id")
        return Request(request_id=new_request_id() if request_id is None else request_id,
                       token_ids=list(token_ids), options=resolved)

    def _check_running(self) -> None:
        state = self._loop.state
        if state is LoopState.CRASHED and self._loop.crash_error is not None:
            raise self._loop.crash_error
        if self._closed or state is LoopState.CLOSED:
            raise NotRunningError("server is not running")
        if state is LoopState.FAILED:
            assert self._loop.load_error is not None
            raise self._loop.load_error

    def open_stream(self, token_ids: Sequence[int], *, per_event: bool = True,
                    **options: Any) -> RequestStream:
        """Low-level: submit a request now and return its event stream (token events, then
        the final ``DoneEvent``; errors raise from the stream).

        Raises at once for unknown or invalid options and for a missing ``adapters`` file
        (``ModelLoadError``). ``timeout`` bounds each event (``per_event``) or the whole call.
        """
        default = DEFAULT_STREAM_TIMEOUT if per_event else DEFAULT_CALL_TIMEOUT
        request = self._request(token_ids, options)
        self._check_running()
        return RequestStream(self._loop, request, options.get("timeout", default),
                             per_event=per_event)

    def open_astream(self, token_ids: Sequence[int], *, per_event: bool = True,
                     **options: Any) -> AsyncRequestStream:
        """Async :meth:`open_stream` (call it inside a running event loop)."""
        default = DEFAULT_STREAM_TIMEOUT if per_event else DEFAULT_CALL_TIMEOUT
        request = self._request(token_ids, options)
        self._check_running()
        return AsyncRequestStream(self._loop, request, options.get("timeout", default),
                                  per_event=per_event)

    def cancel(self, request: Hashable) -> None:
        """Cancel a queued or running request (its id, or a stream this server returned);
        its consumer sees ``CancelledError``. Unknown ids are ignored."""
        request_id = getattr(request, "request_id", request)
        self._loop.cancel(request_id)

    def complete_tokens(self, token_ids: Sequence[int], **options: Any) -> Completion:
        """Generate from tokens; return the text with completion metadata.

        ``timeout`` (default 60 s) bounds the whole call; past it the request is cancelled and
        :class:`~llamapy.errors.RequestTimeoutError` raised.
        """
        collector = Collector(len(token_ids))
        with self.open_stream(token_ids, per_event=False, **options) as events:
            for event in events:
                done = collector.add(event)
                if done is not None:
                    return done
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

    def stream_tokens(self, token_ids: Sequence[int], **options: Any) -> TextChunks:
        """An iterator over text chunks as they are generated (submitted now).

        ``timeout`` (default 30 s) is per chunk. Errors (queue full, failure, timeout) raise
        from the iterator where they happen; closing it early (or dropping it) cancels the
        request. ``.request_id`` is the request's id.
        """
        return TextChunks(self.open_stream(token_ids, **options))

    def stream(self, prompt: str, **options: Any) -> TextChunks:
        """Like :meth:`stream_tokens`, from text."""
        return self.stream_tokens(self.tokenize(prompt), **options)

    def events(self, token_ids: Sequence[int], **options: Any) -> Iterator[StreamEvent]:
        """The raw engine events (tokens with logprobs, then the final event)."""
        return self.open_stream(token_ids, **options)  # type: ignore[return-value]

    # --- asyncio ------------------------------------------------------------------------------

    async def acomplete_tokens(self, token_ids: Sequence[int], **options: Any) -> Completion:
        """Async :meth:`complete_tokens`; cancelling the task cancels the request."""
        collector = Collector(len(token_ids))
        async with self.open_astream(token_ids, per_event=False, **options) as events:
            async for event in events:
                done = collector.add(event)
                if done is not None:
                    return done
        raise AssertionError("request ended without a final event")

    async def acomplete_all(self, calls: Sequence[tuple[Sequence[int], dict[str, Any]]]
                            ) -> list[Completion]:
        """Several requests that live and die together (``n`` choices, several prompts): they
        run concurrently; the first to fail (``QueueFullError``, ...) cancels the others at
        once and is raised, and cancelling the caller cancels them all.

        Refused before any is submitted (``InvalidOptionError`` naming ``n``): more than
        ``max_choices`` requests, or more than the slots plus the queue could ever hold."""
        self.check_fits_at_once(len(calls))
        tasks = [asyncio.ensure_future(self.acomplete_tokens(ids, **opts)) for ids, opts in calls]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def check_fits_at_once(self, count: int) -> None:
        """Raise unless ``count`` sibling requests are within ``max_choices`` and could all be
        running or queued at once, also within one tenant's ``tenant_max_requests`` (see
        :meth:`acomplete_all`)."""
        engine = self._start.engine
        if count > engine.max_choices:
            raise InvalidOptionError(f"n: at most {engine.max_choices} choices times prompts "
                                     f"per request, got {count}", option="n")
        room = engine.n_parallel + engine.max_queue
        if engine.max_queue and count > room:
            raise InvalidOptionError(f"n: {count} requests can never run or wait at once "
                                     f"({engine.n_parallel} slots, max_queue "
                                     f"{engine.max_queue})", option="n")
        if 0 < engine.tenant_max_requests < count:
            raise InvalidOptionError(f"n: {count} requests are more than one tenant may hold "
                                     f"at once (tenant_max_requests "
                                     f"{engine.tenant_max_requests})", option="n")

    async def acomplete(self, prompt: str, **options: Any) -> Completion:
        """Async :meth:`complete`."""
        return await self.acomplete_tokens(await self._atokenize(prompt), **options)

    async def agenerate(self, prompt: str, **options: Any) -> str:
        """Async :meth:`generate`."""
        return (await self.acomplete(prompt, **options)).text

    def astream_tokens(self, token_ids: Sequence[int], **options: Any) -> AsyncTextChunks:
        """Async :meth:`stream_tokens` (an async iterator of text chunks)."""
        return AsyncTextChunks(self.open_astream(token_ids, **options))

    async def astream(self, prompt: str, **options: Any) -> AsyncIterator[str]:
        """Async :meth:`stream`."""
        chunks = self.astream_tokens(await self._atokenize(prompt), **options)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            chunks.cancel()

    def aevents(self, token_ids: Sequence[int], **options: Any
                ) -> AsyncIterator[StreamEvent]:
        """Async :meth:`events`."""
        return self.open_astream(token_ids, **options)  # type: ignore[return-value]

    async def _atokenize(self, prompt: str) -> list[int]:
        if not self._loop.ready.is_set():
            await asyncio.get_running_loop().run_in_executor(None, self._loop.ready.wait)
        return self.model.tokenize(prompt, True, True)

    # --- introspection ------------------------------------------------------------------------

    def stats(self, timeout: float = 10.0) -> dict[str, Any]:
        """A snapshot of the server: slots by state, queue depth, cache and token counters."""
        self._check_running()
        if not self._loop.ready.is_set():
            return {"state": self._loop.state.value}
        stats = self._loop.call(lambda engine: engine.stats().as_dict(), timeout)
        return {"state": self._loop.state.value, **stats}

    def slots(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Each slot's state, cached tokens, scope, session, lease and current request."""
        return list(self.stats(timeout).get("slots", []))

    def call(self, fn: Callable[[Engine], T], timeout: float | None = 60.0) -> T:
        """Run ``fn(engine)`` on the tick thread between ticks (for tools and benchmarks)."""
        self._check_running()
        self.wait_ready()
        return self._loop.call(fn, timeout)

    def open_session(self, config: Any = None) -> Any:
        """Open a workspace :class:`~llamapy.session.Session` on a leased slot of this server
        (waits up to ``config.lease_timeout`` for a free slot, then ``LeaseTimeoutError``)."""
        from ..session import ServerHost, Session, SessionConfig, check_shared

        config = config or SessionConfig()
        check_shared(config)
        self._check_running()
        host = ServerHost(self._loop, self.wait_ready().model, self._start.context,
                          self._start.engine.sampling, resolve_adapters(config.adapters))
        try:
            return Session(host, config)
        except BaseException:
            host.close()
            raise

    def __repr__(self) -> str:
        return f"<Server {os.path.basename(self.model_path)} {self._loop.state.value}>"
