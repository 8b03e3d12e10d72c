"""What the route handlers share: the models' source, metrics, the embedder, request helpers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from starlette.requests import HTTPConnection, Request

from ..embeddings import POOLINGS, Embedder
from ..errors import (
    AuthenticationError,
    EndpointDisabledError,
    InvalidOptionError,
    InvalidRequestError,
    LlamapyError,
    RequestCancelledError,
)
from ..openai_api import ServedModel
from ..openai_api.response_store import ResponseStore
from ..openai_api.responses_background import BackgroundRuns
from ..options.context import ContextOptions
from ..options.serve import ServeOptions
from .embed_bounds import InFlight
from .metrics.registry import Metrics
from .slot_store import SlotStore
from .source import ModelSource
from .tenants import OPEN, KeyTable, Principal, require_admin

T = TypeVar("T")

#: How often a non-streaming handler checks whether its client went away (seconds).
DISCONNECT_POLL_S = 0.25

#: Re-cancellations of a request whose client left before giving up on it.
CANCEL_ATTEMPTS = 40

#: Where :meth:`AppContext.check_key` leaves the request's :class:`Principal` (ASGI scope key).
PRINCIPAL_SCOPE_KEY = "llamapy.principal"

#: Response headers explaining prefix reuse: header -> ``timings`` key.
CACHE_HEADERS = {
    "X-Llamapy-Cache-Tokens": "cache_n",
    "X-Llamapy-Cache-Source": "cache_source",
    "X-Llamapy-Cache-Diverged-At": "cache_diverged_at",
    "X-Llamapy-Prompt-Computed": "prompt_n",
}


#: The serving options' defaults (the option tree's).
_SERVE = ServeOptions()


@dataclass(eq=False)
class AppContext:
    """State of one app: its models' :class:`~llamapy.serve.source.ModelSource` (one model or
    several: the routes never ask which), the metrics and the lazily made embedder. ``keys``:
    the API keys and their tenants (None: no key, everyone the default tenant's admin)."""

    source: ModelSource
    keys: KeyTable | None = None
    embeddings: bool = _SERVE.embeddings
    slots: bool = _SERVE.slots
    metrics_endpoint: bool = _SERVE.metrics
    #: The slot files of ``--slot-save-path`` (None: the slot actions answer 501).
    slot_store: SlotStore | None = None
    #: Stored responses and conversations (None: ``--responses-store off``).
    response_store: ResponseStore | None = None
    #: Seconds of silence after which a stream gets a keep-alive comment (<= 0: never).
    sse_ping_interval: float = _SERVE.sse_ping_interval
    #: ``POST /props`` is accepted (llama-server's ``--props``).
    props_endpoint: bool = _SERVE.props
    metrics: Metrics = field(init=False)
    #: The background responses this app runs (None without a response store).
    background: BackgroundRuns | None = field(default=None, init=False)
    _embedders: dict[str, Embedder] = field(default_factory=dict, init=False)
    #: Embeddings requests in flight, held to the engine's bounds.
    embedding_requests: InFlight = field(default_factory=InFlight, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.engine_stats, self.model_name)
        if self.response_store is not None:
            self.background = BackgroundRuns(self.response_store)
        for collector in self.source.metrics_collectors():
            self.metrics.registry.register(collector)

    @property
    def asleep(self) -> dict[str, Any]:
        """What ``/props``, ``/v1/models`` and ``/metrics`` read while the model sleeps."""
        return self.source.snapshot

    @property
    def sleeping(self) -> bool:
        """Whether the (one) model is asleep (``--sleep-idle-seconds``)."""
        return self.source.sleeping

    def steady(self) -> contextlib.AbstractContextManager[bool]:
        """Around a read-only route's read (blocking: call it off the event loop): the model
        does not fall asleep meanwhile; yields whether it is asleep (then read
        :attr:`asleep`). With several models it yields False."""
        return self.source.steady()

    def model_name(self) -> str:
        """The public model id ("" until the model's loader returned); with several models,
        the one this request leased ("" for none)."""
        return self.source.model_name()

    def engine_stats(self) -> Mapping[str, Any] | None:
        """The engine's stats (while the model sleeps: as they were), or None while the model
        is unavailable."""
        with self.steady() as asleep:
            if asleep:
                stats: Mapping[str, Any] | None = self.asleep.get("stats")
                return stats
            try:
                return self.served().server.stats()
            except LlamapyError:
                return None

    def served(self, request: HTTPConnection | None = None) -> ServedModel:
        """The served model (503 while loading); with several models, the one this request
        leased (:mod:`llamapy.serve.multi`). With ``request``: as the request's tenant sees it
        (:meth:`ServedModel.for_tenant`): every route that generates passes its request, so
        every engine request it makes carries the API key's tenant."""
        served = self.source.current()
        return served if request is None else served.for_tenant(self.principal(request).tenant)

    @contextlib.contextmanager
    def embedder(self, served: ServedModel, pooling: str | None = None) -> Iterator[Embedder]:
        """The embedder of ``pooling`` (default: the server's ``--pooling``, see
        :func:`embedder_pooling`): one per app and pooling, created on first use (with the
        server's thread count), or a fresh one per request, freed after it, where the source
        does not share one (several models: a cached one would keep an unloaded model's
        weights in memory). The request (of ``served.tenant``: pass the request's view,
        ``served(request)``) is held to the engine's bounds while it uses the embedder
        (:mod:`llamapy.serve.embed_bounds`: ``max_queue``, ``tenant_max_requests``; 429)."""
        start = served.server.start_options
        pooling = embedder_pooling(start.context) if pooling is None else pooling
        with self.embedding_requests.hold(served.name, served.tenant, start.engine):
            yield from self._embedder(served, pooling)

    def _embedder(self, served: ServedModel, pooling: str) -> Iterator[Embedder]:
        start = served.server.start_options

        def make() -> Embedder:
            return Embedder(served.model, n_threads=start.context.n_threads, pooling=pooling,
                            max_pending=start.engine.max_queue)  # (the server's queue bound)

        if not self.source.shares_embedder():
            with make() as embedder:
                yield embedder
            return
        with self._lock:
            if pooling not in self._embedders:
                self._embedders[pooling] = make()
            shared = self._embedders[pooling]
        yield shared

    def close(self) -> None:
        """Free the embeddings contexts."""
        with self._lock:
            embedders, self._embedders = list(self._embedders.values()), {}
        for embedder in embedders:
            embedder.close()

    def check_enabled(self, endpoint: str) -> None:
        """Raise :class:`EndpointDisabledError` (501) when ``endpoint`` (``slots``,
        ``metrics`` or ``props``: changing them) is off, with the flag that turns it on (the
        messages are llama-server's)."""
        if endpoint == "props":
            if not self.props_endpoint:
                raise EndpointDisabledError("This server does not support changing global "
                                            "properties. Start it with `--props`")
            return
        enabled = self.slots if endpoint == "slots" else self.metrics_endpoint
        if not enabled:
            raise EndpointDisabledError(
                f"This server does not support {endpoint} endpoint. Start it with `--{endpoint}`")

    def check_key(self, request: HTTPConnection) -> Principal:
        """The request's (or a WebSocket handshake's) :class:`Principal`, also left in its
        ASGI scope for :meth:`principal`; raise :class:`AuthenticationError` unless the
        request carries an API key (one of ``keys``), as ``Authorization: Bearer KEY`` or
        (Anthropic's header) ``x-api-key: KEY``. Keys are compared in constant time. No
        keys: :data:`OPEN`."""
        principal: Principal | None = OPEN
        if self.keys is not None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            offered = [token.strip()] if scheme.lower() == "bearer" else []
            offered.append(request.headers.get("x-api-key", "").strip())
            principal = self.keys.match([key for key in offered if key])
        if principal is None:
            raise AuthenticationError(
                "missing or invalid API key (Authorization: Bearer ... or x-api-key: ...)")
        request.scope[PRINCIPAL_SCOPE_KEY] = principal
        return principal

    def principal(self, request: HTTPConnection) -> Principal:
        """The request's :class:`Principal` (the key is checked now if no route check did)."""
        principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
        return principal if isinstance(principal, Principal) else self.check_key(request)

    def tenant(self, request: HTTPConnection) -> str:
        """The request's tenant as stored objects are filed (``""``: the default tenant)."""
        return self.principal(request).tenant or ""

    def check_admin(self, request: Request, what: str) -> Principal:
        """The request's principal; :class:`PermissionDeniedError` (403) unless it is an
        admin's (``what``: what it asked for, for the message)."""
        return require_admin(self.principal(request), what)


async def read_json(request: Request) -> Any:
    """The request body as JSON (400 when it is not).

    Parsed by orjson, which (unlike ``json``) rejects what would fail later as a 500: nesting
    deeper than 1024 levels, lone UTF-16 surrogates (``"\\ud800"``), invalid UTF-8, and the
    non-JSON ``NaN`` / ``Infinity`` / overflowing numbers.
    """
    raw = await request.body()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"malformed JSON body: {exc}") from None


def stream_flag(body: Any) -> bool:
    """A body's ``stream`` (absent or null: false); anything but a boolean is a 400."""
    value = body.get("stream") if isinstance(body, Mapping) else None
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidOptionError(f"stream must be a boolean, got {value!r}", option="stream")
    return value


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; cancel it (and so its engine request) if the client disconnects, then
    raise :class:`~llamapy.errors.RequestCancelledError` (499, answered to nobody).

    The disconnect is awaited (the server's ``http.disconnect`` message), never polled, so a
    request waiting in the queue costs nothing until its first token or its client leaves.
    """
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        await _cancel(task)
        raise RequestCancelledError("the client disconnected")
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()


async def _disconnect(request: Request) -> None:
    """Return once the client has gone (the request body was read before)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _cancel(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait for it, cancelling again while it runs: on Python < 3.12
    ``asyncio.wait_for`` swallows a cancellation that races with its result (the engine's
    token events arrive all the time), so one ``cancel()`` may not land."""
    for _ in range(CANCEL_ATTEMPTS):
        task.cancel()
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if task.done():
            with contextlib.suppress(BaseException):
                task.result()
            return


def cache_headers(timings: Mapping[str, Any] | None) -> dict[str, str]:
    """The cache explanation headers of a response's ``timings``."""
    if not timings:
        return {}
    out = {}
    for header, key in CACHE_HEADERS.items():
        value = timings.get(key)
        out[header] = "none" if value is None else str(value)
    return out


def final_timings(observe: Callable[[Mapping[str, Any]], None]
                  ) -> Callable[[dict[str, Any]], None]:
    """A chunk hook that passes the ``timings`` of a stream's final chunk to ``observe``."""
    def hook(chunk: dict[str, Any]) -> None:
        timings = chunk.get("timings")
        if isinstance(timings, Mapping):
            observe(timings)

    return hook


def embedder_pooling(context: ContextOptions) -> str:
    """The embeddings' pooling for ``--pooling``: ``mean`` unless ``cls`` or ``last`` is asked
    for (``unspecified`` keeps llamapy's mean; ``none`` and ``rank`` never reach an embedder:
    the OpenAI endpoint refuses ``none``)."""
    return context.pooling_type if context.pooling_type in POOLINGS else "mean"
