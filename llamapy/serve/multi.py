"""Several models behind one app: a :class:`~llamapy.server.ModelManager` picks the model.

:class:`ModelSelect` (ASGI middleware) reads the request's model (the JSON body's ``model``,
else the ``model`` query parameter; none: the first model), checks the API key, takes a lease
on that model from the manager (loading it on demand; waiting, bounded by the request timeout,
while it loads or while the budget has no room) and holds the lease until the response has been
sent, streams included, so a model is never unloaded under a request. The handlers then find
their model with :meth:`ModelRouter.current`, exactly as they find the one model of a
single-model app. An unknown model is a 404 listing the served ones; a model that failed to
load answers with its own typed error. Only the routes that run on a model take a lease (each
route declares it: :mod:`llamapy.serve.model_use`; a path no route serves takes none, so a stray
request never loads a model); ``/metrics`` takes one only when it names a model. The key is
checked from the headers before the body is read, and before anything loads: a request without
a valid key is a 401, and ``/metrics`` is an admin's, so a tenant key's ``/metrics?model=`` is
a 403 that loads nothing. With
``--pull-on-demand`` a name that is not served and spells the Hub out (``hf.co/ORG/REPO``) is
pulled first, for an admin's key only (:func:`~llamapy.serve.tenants.require_admin`, the rule
``/models/load`` follows): a tenant key gets the 403 before the Hub is asked anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import orjson
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import LlamapyError, ModelNotFoundError, NotReadyError, UnknownModelError
from ..openai_api import ServedModel
from ..openai_api.target import DEFAULT_REQUEST_TIMEOUT
from ..options.hub import is_pull_name
from ..server import ModelLease, ModelManager, ModelState, ModelStatus
from .anthropic_errors import anthropic_error_response
from .errors import error_response
from .model_use import ModelUse, RoutePolicy
from .ollama_errors import ollama_error_response
from .source import Listed
from .tenants import Principal, require_admin

__all__ = ["ModelRouter", "ModelSelect", "ModelsCollector", "check_caller", "model_entry",
           "path_error"]


_current: ContextVar[ServedModel | None] = ContextVar("llamapy_served_model", default=None)


class ModelRouter:
    """The manager plus how each of its models is presented (:class:`ServedModel` options):
    the several-models :class:`~llamapy.serve.source.ModelSource`.

    ``chat_templates`` maps a model name to its template override (else ``served``'s
    ``chat_template``). ``served``: the app-wide ServedModel options (``request_timeout``,
    ``n_predict``, ``tags``, ...; a ``name`` or ``aliases`` here is ignored: each model's come
from its spec); ``accept_any_model`` sends unknown names to the first model; ``puller``
    (``--pull-on-demand``) is called on a worker thread with a Hub name (``hf.co/...``) the
    manager does not know, for an admin's request only, before its lease, and returns the name
    it now serves or raises.
    """

    several = True
    sleeping = False

    def __init__(self, manager: ModelManager, *, chat_templates: Mapping[str, str] | None = None,
                 puller: Callable[[str], str] | None = None, **served: Any) -> None:
        self.manager = manager
        self._puller = puller  # pulls a Hub model a request names (llamapy.hub.on_demand)
        self._templates = dict(chat_templates or {})
        self._served = {k: v for k, v in served.items() if k not in ("name", "aliases")}
        self._cache: dict[str, ServedModel] = {}

    @property
    def request_timeout(self) -> float:
        """How long a request waits for its model to load (the request timeout)."""
        return float(self._served.get("request_timeout", DEFAULT_REQUEST_TIMEOUT))

    def pick(self, requested: str | None) -> str:
        """The model a request names (none: the first; unknown: 404, or the first with
        ``accept_any_model``); a name with Ollama's ``:latest`` tag means the name without."""
        names = self.manager.names
        if not requested:
            if not names:
                raise UnknownModelError("", names)
            return names[0]
        try:
            return self.manager.resolve(requested)
        except UnknownModelError:
            if requested.endswith(":latest") and requested != ":latest":
                with contextlib.suppress(UnknownModelError):
                    return self.manager.resolve(requested.removesuffix(":latest"))
            if self._served.get("accept_any_model") and names:
                return names[0]
            raise

    @property
    def pulls(self) -> bool:
        """Whether a Hub model that is not served is pulled when named (``--pull-on-demand``)."""
        return self._puller is not None

    async def pick_or_pull(self, requested: str | None, principal: Principal) -> str:
        """:meth:`pick`, or with :attr:`pulls` a Hub model (``hf.co/ORG/REPO``) pulled into
        the store and served first (on a worker thread), when ``principal`` is an admin's
        (else a 403); ``UnknownModelError`` for a name that is neither."""
        try:
            return self.pick(requested)
        except UnknownModelError:
            if self._puller is None or not requested or not is_pull_name(requested):
                raise
            require_admin(principal, "pulling a model from the Hub")
            return await run_in_threadpool(self._puller, requested)

    async def lease(self, requested: str | None, principal: Principal) -> ModelLease:
        """A lease on the requested model (:meth:`pick_or_pull`, as ``principal`` may): at
        once on the event loop when it is loaded, else (starting its load) waiting in a worker
        thread, bounded by the request timeout."""
        name = await self.pick_or_pull(requested, principal)
        lease = self.manager.try_acquire(name)
        if lease is not None:
            return lease
        return await run_in_threadpool(self.manager.acquire, name, self.request_timeout)

    @contextlib.asynccontextmanager
    async def hold(self, requested: str | None, principal: Principal) -> AsyncIterator[None]:
        """The requested model leased (:meth:`lease`) for the ``async with`` block, in which
        :meth:`current` finds it, as :class:`ModelSelect` holds it for an HTTP request (the
        WebSocket routes hold it per response)."""
        lease = await self.lease(requested, principal)
        try:
            token = _current.set(self.served_for(lease))
            try:
                yield
            finally:
                _current.reset(token)
        finally:
            lease.release()

    def served_for(self, lease: ModelLease) -> ServedModel:
        """The :class:`ServedModel` of a leased server (made once per loaded server)."""
        return self._served_model(lease.name, lease.server)

    def peek(self, requested: str | None) -> ServedModel | None:
        """The requested model if it is loaded now, without a lease (None while it is not):
        for read-only views such as the live view's events (404 for an unknown model)."""
        name = self.pick(requested)
        server = self.manager.peek(name)
        return None if server is None else self._served_model(name, server)

    def _served_model(self, name: str, server: Any) -> ServedModel:
        cached = self._cache.get(name)
        if cached is None or cached.server is not server:
            status = self.manager.status_of(name)
            options = {**self._served, "chat_template":
                       self._templates.get(name, self._served.get("chat_template"))}
            cached = self._cache[name] = ServedModel(
                server, name=name, aliases=status.aliases, **options)
        return cached

    def current(self) -> ServedModel:
        """The model this request leased (503 for a request that leased none)."""
        served = _current.get()
        if served is None:
            raise NotReadyError("this request names no model (pass 'model' or ?model=)")
        return served

    def model_list(self) -> dict[str, Any]:
        """``/v1/models``: every model with its state (llama-server router mode's shape)."""
        return {"object": "list", "data": [model_entry(s) for s in self.manager.status()]}

    def model_entry(self, model_id: str) -> dict[str, Any]:
        """``/v1/models/{id}``: the model with its state (404 unless served here)."""
        return model_entry(self.manager.status_of(model_id))

    @property
    def snapshot(self) -> dict[str, Any]:
        """Nothing: several models never sleep (their keep-alive unloads them instead)."""
        return {}

    def model_name(self) -> str:
        """The id of the model this request leased ("" for none)."""
        try:
            return self.current().name
        except LlamapyError:
            return ""

    def steady(self) -> contextlib.AbstractContextManager[bool]:
        """Nothing to hold: a read-only route reads a leased model; never asleep."""
        return contextlib.nullcontext(False)

    def check_health(self) -> None:
        """Nothing: the app serves while any model may load (``/v1/models`` tells each)."""

    def check_named(self, requested: str | None) -> None:
        """404 for a model name that is not served (:meth:`pick`)."""
        self.pick(requested)

    def state_of(self, requested: str | None) -> tuple[str, str]:
        """``(name, state)`` of the named model."""
        name = self.pick(requested)
        return name, self.manager.status_of(name).state.value

    def model_states(self) -> list[dict[str, str]]:
        """Each model's ``{"id", "state"}``."""
        return [{"id": s.name, "state": s.state.value} for s in self.manager.status()]

    def listing(self) -> list[Listed]:
        """Every model, loaded or not, with its keep-alive."""
        return [Listed(s.name, s.path, self.peek(s.name), s.keep_alive)
                for s in self.manager.status()]

    def serves(self, name: str) -> bool:
        """Whether ``name`` picks a served model (:meth:`pick`; "" picks none here)."""
        try:
            self.pick(name)
        except ModelNotFoundError:
            return False
        return bool(name)

    def keep(self, name: str, seconds: float | None) -> None:
        """A request's ``keep_alive`` for ``name``, handed to the manager."""
        self.manager.keep(name, seconds)

    def shares_embedder(self) -> bool:
        """False: an embeddings context per request (a kept one would pin an unloaded model's
        weights)."""
        return False

    def middleware(self, check_key: Callable[[Any], Any], policy: RoutePolicy
                   ) -> list[tuple[Any, dict[str, Any]]]:
        """:class:`ModelSelect`: the request's model leased for its response."""
        return [(ModelSelect, {"router": self, "check_key": check_key, "policy": policy})]

    def metrics_collectors(self) -> list[Any]:
        """Each model's state, requests in flight and memory (:class:`ModelsCollector`)."""
        return [ModelsCollector(self.manager)]

    def on_sleep(self, hook: Callable[[ServedModel], None]) -> None:
        """Nothing: several models never sleep."""

    def wait_started(self, timeout: float | None) -> ServedModel | None:
        """None at once: no model starts with the app."""
        return None

    def close(self) -> None:
        """Unload every model."""
        self.manager.close()


def model_entry(status: ModelStatus) -> dict[str, Any]:
    """One model of ``/v1/models`` with its ``status`` (``value``: loaded, loading, unloaded,
    failed; a failed one adds ``failed`` and ``error``)."""
    state: dict[str, Any] = {"value": status.state.value}
    if status.error:
        state.update(failed=True, error=status.error)
    return {"id": status.name, "object": "model", "owned_by": "llamapy",
            "aliases": [status.name, *status.aliases], "status": state,
            "in_flight": status.in_flight, "pinned": status.pinned,
            "memory_mb": round(status.memory_mb, 1)}


class ModelsCollector(Collector):
    """``/metrics`` of a several-models app: each model's state, requests in flight and
    charged memory, with a ``model`` label (a model's engine metrics: ``/metrics?model=``)."""

    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager

    def collect(self) -> Iterator[Metric]:
        """The model families."""
        statuses = self._manager.status()
        state = GaugeMetricFamily("llamapy_model_state", "1 for each model's current state",
                                  labels=["model", "state"])
        in_flight = GaugeMetricFamily("llamapy_model_in_flight",
                                      "Requests holding or waiting for each model",
                                      labels=["model"])
        memory = GaugeMetricFamily("llamapy_model_memory_mb",
                                   "Memory each model is charged against the budget, MiB",
                                   labels=["model"])
        for status in statuses:
            for value in ModelState:
                state.add_metric([status.name, value.value], float(status.state is value))
            in_flight.add_metric([status.name], float(status.in_flight))
            memory.add_metric([status.name], status.memory_mb)
        yield from (state, in_flight, memory)


class ModelSelect:
    """ASGI middleware: lease the request's model for the whole response (see the module)."""

    def __init__(self, app: ASGIApp, router: ModelRouter, check_key: Any,
                 policy: RoutePolicy) -> None:
        self.app = app
        self.router = router
        self.check_key = check_key
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        use = self.policy.use(path)
        if scope["type"] != "http" or use.lease == "never":
            await self.app(scope, receive, send)
            return
        try:
            principal = check_caller(self.check_key, scope, use)  # before the body is read
        except LlamapyError as exc:
            await path_error(path, exc)(scope, receive, send)
            return
        messages = await _read_body(receive)
        replay = _replay(messages, receive)
        requested = _requested_model(scope, messages)
        if requested is None and use.lease == "named":
            await self.app(scope, replay, send)
            return
        try:
            lease = await self.router.lease(requested, principal)
        except LlamapyError as exc:
            await path_error(path, exc)(scope, replay, send)
            return
        try:
            token = _current.set(self.router.served_for(lease))
            try:
                await self.app(scope, replay, send)
            finally:
                _current.reset(token)
        except LlamapyError as exc:  # a bad per-model chat template: before any response
            await path_error(path, exc)(scope, replay, send)
        finally:
            lease.release()  # never blocks: an unload it causes runs on its own thread


def check_caller(check_key: Callable[[Request], Any], scope: Scope, use: ModelUse
                 ) -> Principal:
    """The :class:`Principal` of a request on a model route, from its headers alone (before
    its body is read or its model loaded or woken): ``check_key``'s (a 401 without a valid
    key), and a 403 unless it is an admin's where ``use`` is an admin's."""
    principal: Principal = check_key(Request(scope))
    if use.admin:
        require_admin(principal, scope.get("path", ""))
    return principal


def path_error(path: str, exc: LlamapyError) -> Any:
    """The error response in the route's shape (Anthropic's under ``/v1/messages``, Ollama's
    under ``/api/``)."""
    if path.startswith("/api/"):
        return ollama_error_response(exc)
    return anthropic_error_response(exc) if path.startswith("/v1/messages") else (
        error_response(exc))


async def _read_body(receive: Receive) -> list[Message]:
    """The request's messages up to the end of its body (the body limit applies before)."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives the buffered messages again, then the client's."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


def _requested_model(scope: Scope, messages: list[Message]) -> str | None:
    """The JSON body's string ``model``, else the ``model`` query parameter, else None."""
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
    if body:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None  # the handler answers the 400
        if isinstance(parsed, dict) and isinstance(parsed.get("model"), str):
            return str(parsed["model"]) or None
    query = Request(scope).query_params.get("model")
    return query or None
