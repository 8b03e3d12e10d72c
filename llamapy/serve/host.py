"""The model behind the app: one model on a one-spec :class:`~llamapy.server.ModelManager`.

``ModelHost(server, **options)`` serves a running :class:`~llamapy.server.Server` (which may
itself still be loading its model); ``ModelHost(loader, **options)`` runs ``loader()`` on the
manager's load thread (fetching the default model, say) while the HTTP server already answers
``/health`` with 503. ``options`` are those of :class:`~llamapy.openai_api.ServedModel`
(``name``, ``chat_template``, ``request_timeout``).

The manager owns the model's life, as it does for several models: loading, a stored load
failure, and ``--sleep-idle-seconds N``, which is the spec's ``keep_alive`` (a loader is needed:
it is rerun to wake the model). *Asleep* is the manager's status of a model unloaded for
idleness: ``UNLOADED`` (or ``LOADING`` again, while a request wakes it) after having been
loaded. The policy (llama-server's): a request on a route that runs on the model holds a lease
for its whole response (:meth:`enter`; streams included), waking the model first, so the
request waits for the reload. Once no lease has been held for N seconds, the manager unloads
it, calling the host's hooks first (the app snapshots ``/props``, ``/v1/models`` and the
engine's stats, which the read-only routes answer from while it sleeps). A read-only route
reads the model under :meth:`steady`: held loaded (or asleep) meanwhile, without counting as
activity. With a loader, a request's Ollama ``keep_alive: 0`` puts the model to sleep the same
way once its last request ends (Ollama's "unload now"; the next request wakes it, and the app's
own idle bound applies again); a server given to the host stays loaded (nothing could reload
it).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from starlette.concurrency import run_in_threadpool

from ..errors import (
    InvalidOptionError,
    LlamapyError,
    LoadFailedError,
    ModelNotFoundError,
    NotReadyError,
)
from ..ollama_api import served_name
from ..openai_api import ServedModel
from ..openai_api.target import check_presentation
from ..server import ModelLease, ModelManager, ModelSpec, ModelState, Server
from .model_use import RoutePolicy
from .sleep import WakeOnRequest, sleep_snapshot
from .source import Listed, model_card, model_listing
from .tenants import Principal

log = logging.getLogger("llamapy.serve")

Loader = Callable[[], Server]

#: The one spec's name inside the host's manager (the public name is the ServedModel's).
_MODEL = "model"


class ModelHost:
    """Holds the :class:`ServedModel`; :meth:`get` raises the typed reason it is unavailable.
    The one-model :class:`~llamapy.serve.source.ModelSource`."""

    several = False
    pulls = False

    def __init__(self, target: Server | Loader, *, sleep_idle_seconds: float | None = None,
                 **served: Any) -> None:
        check_presentation(**served)
        self._options = served
        self.sleeps = sleep_idle_seconds is not None and sleep_idle_seconds >= 0
        given = target if isinstance(target, Server) else None
        #: Whether the model can be unloaded and woken again (a loader reruns).
        self.reloads = given is None
        if self.sleeps and given is not None:
            raise InvalidOptionError("sleep_idle_seconds needs a loader to reload the model "
                                     "with", option="sleep_idle_seconds")
        self.sleep_hooks: list[Callable[[ServedModel], None]] = []
        #: What the read-only routes answer while asleep (taken as the model falls asleep).
        self.snapshot: dict[str, Any] = {}
        self._slept = False
        self._served: ServedModel | None = None
        self._lock = threading.Lock()
        spec = ModelSpec(name=_MODEL, path="" if given is None else given.model_path,
                         keep_alive=sleep_idle_seconds if self.sleeps else -1)
        self.manager = ModelManager(
            [spec], server_factory=_factory(target),
            on_idle_unload=self._falls_asleep if self.reloads else None)
        self.manager.start(_MODEL)

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Block until the model has loaded or failed to (at most ``timeout`` s); return
        whether it did."""
        return self.manager.wait_settled(_MODEL, timeout).state is not ModelState.LOADING

    def wait_started(self, timeout: float | None) -> ServedModel | None:
        """The model once its first load has settled (at most ``timeout`` s), if loaded."""
        self.wait_loaded(timeout)
        return self.served

    @property
    def served(self) -> ServedModel | None:
        """The served model while it is loaded, else None."""
        server = self.manager.peek(_MODEL)
        return None if server is None else self._served_model(server)

    def get(self) -> ServedModel:
        """The served model if its server is ready; else raise why not (503)."""
        server = self.manager.peek(_MODEL)
        if server is not None:
            served = self._served_model(server)
            served.server.fetch_model()  # a server that died since: NotRunningError, ...
            return served
        error = self.manager.failure(_MODEL)
        if error is not None:
            raise error
        raise NotReadyError("the model is asleep" if self.sleeping else "loading model")

    current = get

    def model_name(self) -> str:
        """The public model id ("" until the loader returned; asleep: as it was)."""
        served = self.served
        if served is None and self.sleeping:
            return str(self.snapshot["props"]["model_alias"])
        return served.name if served is not None else ""

    def check_health(self) -> None:
        """Raise why the model cannot serve; asleep (maybe since just now) it can."""
        try:
            self.get()
        except NotReadyError:
            if not self.sleeping:
                raise

    def check_named(self, requested: str | None) -> None:
        """Nothing: one model answers whatever a read-only view names."""

    def peek(self, requested: str | None) -> ServedModel:
        """The model (the name is not looked at); raises while it is unavailable."""
        return self.get()

    def state_of(self, requested: str | None) -> tuple[str, str]:
        """``(name, "loading")``: :meth:`peek` raises rather than finding it unloaded."""
        return self.model_name(), "loading"

    def model_states(self) -> list[dict[str, str]]:
        """None: the live view's model picker is for several models."""
        return []

    def listing(self) -> list[Listed]:
        """The model (raises while it is unavailable)."""
        served = self.get()
        return [Listed(served.name, served.server.model_path, served)]

    def model_list(self) -> dict[str, Any]:
        """``/v1/models`` of the one model, loaded or asleep (as it was; never half closed)."""
        with self.steady() as asleep:
            if asleep:
                return dict(self.snapshot["models"])
            return model_listing(self.get())

    def model_entry(self, model_id: str) -> dict[str, Any]:
        """``/v1/models/{id}`` (asleep: as it was; looking does not wake it)."""
        with self.steady() as asleep:
            if asleep:
                card: dict[str, Any] = self.snapshot["models"]["data"][0]
                if model_id not in card["aliases"]:
                    raise ModelNotFoundError(f"model {model_id!r} is not served here")
                return card
            served = self.get()
            served.check_model(model_id)
            return model_card(served)

    def serves(self, name: str) -> bool:
        """Whether ``name`` is one of the model's names (Ollama's ``:latest`` too)."""
        try:
            served_name(self.get(), name)
        except ModelNotFoundError:
            return False
        return True

    async def pick_or_pull(self, requested: str | None, principal: Principal) -> str:
        """The model's name (one model pulls nothing)."""
        return self.get().name

    def keep(self, name: str, seconds: float | None) -> None:
        """A request's ``keep_alive``: 0 puts a reloadable model to sleep once its last request
        ends (see the module); other values change nothing (the app's own bound applies)."""
        if seconds == 0 and self.reloads:
            self.manager.keep(_MODEL, 0)

    def shares_embedder(self) -> bool:
        """True: one embeddings context for the app's life."""
        return True

    def middleware(self, check_key: Callable[[Any], Any], policy: RoutePolicy
                   ) -> list[tuple[Any, dict[str, Any]]]:
        """With a loader: :class:`~llamapy.serve.sleep.WakeOnRequest` (a request on a route
        that wakes the model holds it, waking it first); else none."""
        return [(WakeOnRequest, {"enter": self.enter, "check_key": check_key,
                                 "policy": policy, "try_enter": self.try_enter}
                 )] if self.reloads else []

    def metrics_collectors(self) -> list[Any]:
        """None beyond the engine's."""
        return []

    def on_sleep(self, hook: Callable[[ServedModel], None]) -> None:
        """Call ``hook`` before the model falls asleep (after the snapshot)."""
        self.sleep_hooks.append(hook)

    def status(self) -> str:
        """``loading``, ``ready`` or ``failed``."""
        try:
            self.get()
        except NotReadyError:
            return "loading"
        except LlamapyError:
            return "failed"
        return "ready"

    @property
    def sleeping(self) -> bool:
        """Whether the model was unloaded for idleness (and has not woken yet)."""
        return self._slept and self.manager.status_of(_MODEL).state is not ModelState.LOADED

    @contextlib.contextmanager
    def steady(self) -> Iterator[bool]:
        """Hold the model loaded or asleep while a read-only route reads it (without counting
        as activity); yields whether it is asleep. A sleep under way is waited for: the route
        never sees the model half closed."""
        with self.manager.hold(_MODEL) as server:
            yield server is None and self.sleeping

    @contextlib.asynccontextmanager
    async def hold(self, requested: str | None, principal: Principal) -> AsyncIterator[None]:
        """The model held for the block: woken first if asleep (as :class:`WakeOnRequest`
        does for a request; one model: ``requested`` was checked by the route)."""
        lease = None
        if self.reloads:
            lease = self.try_enter() or await run_in_threadpool(self.enter)
        try:
            yield
        finally:
            if lease is not None:
                lease.release()

    def try_enter(self) -> ModelLease | None:
        """A lease on the model if it is loaded now and the manager free (never blocks, never
        wakes it: an event loop may call it)."""
        return self.manager.try_acquire(_MODEL, blocking=False)

    def enter(self) -> ModelLease | None:
        """A request that runs on the model starts: a lease on it, waking a sleeping model
        first (blocking until it is loaded again). None while it is loading for the first time
        or failed: the route then answers why."""
        lease = self.manager.try_acquire(_MODEL)
        if lease is not None or not self.sleeping:
            return lease
        log.info("waking up: reloading the model")
        self.manager.keep(_MODEL, None)  # a keep_alive 0 was for the last wake only
        try:
            if self.manager.failure(_MODEL) is not None:
                self.manager.load(_MODEL, None)  # the last wake-up failed: try again
            return self.manager.acquire(_MODEL, None)
        except LlamapyError:
            return None  # the reload failed: the route answers with its stored error

    def _served_model(self, server: Any) -> ServedModel:
        with self._lock:
            if self._served is None or self._served.server is not server:
                self._served = ServedModel(server, **self._options)
            return self._served

    def _falls_asleep(self, name: str, server: Any) -> None:
        """The manager unloads the idle model (its lock held): the snapshot is taken and the
        hooks see it first."""
        served = self._served_model(server)
        self.snapshot = sleep_snapshot(served, model_listing(served))
        self._slept = True
        for hook in self.sleep_hooks:
            hook(served)
        log.info("idle: the model sleeps (unloaded until the next request)")

    def close(self) -> None:
        """Close the manager and with it the server (when the app owns it)."""
        self.manager.close()


def _factory(target: Server | Loader) -> Callable[[ModelSpec], Server]:
    """The host's server factory: the given server once it is ready, or the loader's (typed
    load errors)."""
    if isinstance(target, Server):
        # waited for here: a load error is stored and the given server left as it is (a
        # server the factory returned and that then failed would be closed by the manager)
        return lambda spec: target.wait_ready(None)

    def load(spec: ModelSpec) -> Server:
        try:
            return target()
        except LoadFailedError:
            raise
        except Exception as exc:  # any other error while fetching (a missing file is not a 404
            # here: the server failed to load): report, never die silently
            log.error("model load failed: %s", exc)
            raise LoadFailedError(exc) from exc

    return load
