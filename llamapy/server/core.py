"""What every ``Server`` method builds on: its tick loop, its lifecycle and its errors.

:class:`ServerCore` owns the :class:`~llamapy.runtime.TickLoop` that loads the model and runs
the engine, answers whether the model is available (:meth:`~ServerCore.fetch_model` raises the
typed reason, :meth:`~ServerCore.try_model` returns None), validates calls
(:func:`~llamapy.server.calls.prepare_call`) and waits for the load within a call's budget, on a
thread (:meth:`~ServerCore._wait_loaded`) or an event loop (:meth:`~ServerCore._await_loaded`).
Sessions open here too (:meth:`~ServerCore.open_session`). The blocking generation calls are
in :mod:`llamapy.server.server`, the asyncio ones in :mod:`llamapy.server.aio`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..adapters import resolve_adapters
from ..engine import Engine
from ..engine.media import MediaPrompt
from ..errors import (
    InvalidOptionError,
    LlamapyError,
    NotReadyError,
    NotRunningError,
)
from ..media.checks import check_physical_batch, no_projector
from ..runtime import Hosted, LoopState, ModelInfo, PendingStreams, TickLoop
from .calls import Call, ReadySignal, load_timeout_error, prepare_call
from .intent import GenerationIntent, resolve_intent, revise_intent
from .options import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_STREAM_TIMEOUT,
    ResolvedStart,
    resolve_start_options,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..options.typed import GenerationOptions
    from ..session import Session, SessionConfig

__all__ = ["ServerCore"]

T = TypeVar("T")
S = TypeVar("S", bound="ServerCore")


class ServerCore:
    """The state and lifecycle of a :class:`~llamapy.server.Server` (see the module)."""

    model_path: str
    _start: ResolvedStart
    _loop: TickLoop
    _closed: bool
    _pending: PendingStreams
    _ready: ReadySignal

    def _open(self, build: Callable[[ResolvedStart], Hosted],
              model_path: str | os.PathLike[str], options: dict[str, Any]) -> None:
        self._start = start = resolve_start_options(model_path, options)
        self.model_path = start.server.model_path
        self._loop = TickLoop(lambda: build(start),
                              thread_name=start.server.name or "llamapy-server",
                              stall_timeout=start.server.stall_timeout)
        self._closed = False
        self._pending = PendingStreams()
        self._ready = ReadySignal(self._loop.ready)

    # --- lifecycle ----------------------------------------------------------------------------

    def _unavailable(self, model: Any) -> LlamapyError | None:
        """Why ``model`` (the loop's, read first) cannot be used, or None."""
        state = self._loop.state
        if state is LoopState.CRASHED and self._loop.crash_error is not None:
            return self._loop.crash_error
        if self._closed or state is LoopState.CLOSED:
            return NotRunningError("server is not running")
        if state is LoopState.FAILED:
            return self._loop.load_error
        if state is LoopState.LOADING or model is None:
            return NotReadyError("server is still loading its model")
        return None

    def fetch_model(self) -> ModelInfo:
        """The loaded model, without a round trip to the tick thread.

        Raises :class:`~llamapy.errors.NotReadyError` while loading,
        :class:`~llamapy.errors.LoadFailedError` after a failed load and
        :class:`~llamapy.errors.NotRunningError` once closed (``RuntimeDiedError`` if the
        thread died). See :meth:`try_model` for a version that never raises.
        """
        model = self._loop.model
        error = self._unavailable(model)
        if error is not None:
            raise error
        assert model is not None  # (_unavailable says so when it is)
        return model

    def try_model(self) -> ModelInfo | None:
        """The loaded model, or None while loading, after a failed load or once closed."""
        model = self._loop.model
        return None if self._unavailable(model) is not None else model

    @property
    def model(self) -> ModelInfo:
        """The model (see :meth:`fetch_model`, which raises the same typed errors)."""
        return self.fetch_model()

    def wait_ready(self: S, timeout: float | None = None) -> S:
        """Block until the model is loaded and return the server; raise
        :class:`~llamapy.errors.LoadFailedError` if it failed, ``NotReadyError`` past
        ``timeout`` seconds."""
        if not self._loop.ready.wait(timeout):
            raise NotReadyError("server is still loading its model")
        self.fetch_model()
        return self

    @property
    def ready(self) -> bool:
        """Whether the model is loaded and the server accepts work."""
        return self._loop.state is LoopState.READY and not self._closed

    @property
    def n_ctx_seq(self) -> int:
        """Context tokens one request may use, known once the model is loaded (0 before):
        read without a round trip to the tick thread."""
        return self._loop.n_ctx_seq

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

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_running(self) -> None:
        """Raise unless the server is loading or ready (the reasons of :meth:`_unavailable`,
        but for a load still under way)."""
        error = self._unavailable(self._loop.model)
        if error is not None and not isinstance(error, NotReadyError):
            raise error

    # --- calls --------------------------------------------------------------------------------

    def resolve(self, **options: Unpack[GenerationOptions]) -> GenerationIntent:
        """The :class:`~llamapy.server.GenerationIntent` of a call's keyword ``options``
        (renamed, defaulted from the server's sampling options and checked against its limits
        once); every generation method takes it in place of the keywords. Raises as a call
        with those keywords would, before anything is submitted."""
        return resolve_intent(options, self._start)

    def revise(self, intent: GenerationIntent, **changes: Any) -> GenerationIntent:
        """``intent`` with some request or sampling options changed, checked as
        :meth:`resolve` checks them (``timeout`` and ``request_id`` are not revised)."""
        return revise_intent(intent, changes, self._start)

    def _prepare(self, intent: GenerationIntent | None, options: Mapping[str, Any], *,
                 per_event: bool) -> Call:
        """Validate a call (its intent or options, then that the server runs); the deadline
        starts now. An intent and keyword options together are a ``TypeError``."""
        if intent is not None and options:
            raise TypeError(f"give a GenerationIntent or keyword options, not both "
                            f"(got {sorted(options)})")
        if intent is not None and not isinstance(intent, GenerationIntent):
            raise TypeError(f"expected a GenerationIntent, got {type(intent).__name__}")
        default = DEFAULT_STREAM_TIMEOUT if per_event else DEFAULT_CALL_TIMEOUT
        call = prepare_call(options if intent is None else intent, self._start,
                            per_event=per_event, default_timeout=default)
        self._check_running()
        return call

    def _wait_loaded(self, wait: float | None, timeout: float | None) -> None:
        """Block up to ``wait`` seconds for the load (a call of ``timeout`` s); raise the
        load's error, ``NotRunningError``, or ``RequestTimeoutError`` past it."""
        if not self._loop.ready.wait(wait):
            self._check_running()
            raise load_timeout_error(timeout)
        self._check_running()

    async def _await_loaded(self, wait: float | None, timeout: float | None) -> None:
        """:meth:`_wait_loaded` for an event loop (which it never blocks)."""
        if not await self._ready.wait(wait):
            self._check_running()
            raise load_timeout_error(timeout)
        self._check_running()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True, *,
                 timeout: float | None = None) -> list[int]:
        """Tokenize with the served model, waiting up to ``timeout`` seconds (None: no bound)
        for its load (then :class:`~llamapy.errors.RequestTimeoutError`)."""
        self._wait_loaded(timeout, timeout)
        return self.fetch_model().tokenize(text, add_special, parse_special)

    @property
    def modalities(self) -> dict[str, bool]:
        """What the served model takes besides text: ``{"vision": ..., "audio": ...}`` (both
        False without a projector, or while it loads)."""
        media = self._loop.media
        return dict(media.modalities) if media is not None else {"vision": False,
                                                                 "audio": False}

    def media_prompt(self, text: str, media: Sequence[bytes], *, add_special: bool = True,
                     parse_special: bool = True, timeout: float | None = None,
                     tenant: str | None = None) -> MediaPrompt:
        """Tokenize ``text`` with ``media``: each media marker (``<__media__>``) in ``text``
        stands for the next item (PNG, JPEG, GIF or BMP bytes; WAV, MP3 or FLAC for an audio
        projector). The result goes wherever token ids go (``complete_tokens``, ...): its
        media is decoded with it, and a later prompt with the same media at the same place
        reuses its KV. Waits up to ``timeout`` for the load. Blocks while the media is
        encoded: call it off an event loop; the encoder serves ``tenant``'s media (None: the
        default tenant's) in turn with other tenants' and bounds the bytes each holds
        (:mod:`llamapy.media.queue`). :class:`~llamapy.errors.MediaError` for media the
        server refuses (see :class:`~llamapy.options.limits.RequestLimits`) or a model
        without a projector (reason ``"no_projector"``); :class:`~llamapy.errors.MediaBusyError`
        when the encoder's queue is full."""
        self._wait_loaded(timeout, timeout)
        encoder = self._loop.media
        if encoder is None:
            raise no_projector()
        prompt: MediaPrompt = encoder.prompt(text, media, self._start.engine, tenant=tenant,
                                             add_special=add_special,
                                             parse_special=parse_special,
                                             max_tokens=self._loop.n_ctx_seq or None)
        return check_physical_batch(prompt, self._start.context.n_ubatch)

    def cancel(self, request: Hashable) -> None:
        """Cancel a request (its id, or a stream this server returned), queued, running or
        not yet submitted (a stream not iterated yet is then never submitted); its consumer
        sees :class:`~llamapy.errors.RequestCancelledError`. Unknown ids are ignored."""
        request_id = getattr(request, "request_id", request)
        self._pending.cancel(request_id)
        self._loop.cancel(request_id)

    def check_fits_at_once(self, count: int) -> None:
        """Raise unless ``count`` sibling requests are within ``max_choices`` and could all be
        running or queued at once, also within one tenant's ``tenant_max_requests`` (see
        ``acomplete_all``)."""
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

    # --- sessions -----------------------------------------------------------------------------

    def open_session(self, config: SessionConfig | None = None) -> Session:
        """Open a workspace :class:`~llamapy.session.Session` on a leased slot of this server
        (waits for the load, then up to ``config.lease_timeout`` for a free slot, then
        ``LeaseTimeoutError``)."""
        from ..session import ServerHost, Session, SessionConfig, check_shared

        config = config or SessionConfig()
        check_shared(config)
        self._check_running()
        host = ServerHost(self._loop, self.wait_ready().model, self._start.context,
                          self._start.engine.sampling, resolve_adapters(config.adapters),
                          media=self._loop.media, limits=self._start.engine)
        try:
            return Session(host, config)
        except BaseException:
            host.close()
            raise

    async def aopen_session(self, config: SessionConfig | None = None) -> Session:
        """Async :meth:`open_session` (loading and leasing wait: it runs on a worker thread).
        Cancelled (directly or by ``asyncio.wait_for``'s timeout), it hands back whatever the
        worker leases, whenever the lease comes (:func:`llamapy.session.lease.open_off_loop`)."""
        from ..session.lease import open_off_loop

        return await open_off_loop(lambda: self.open_session(config))
