"""``ModelManager``: many models, each its own :class:`~llamapy.server.Server` (own tick thread),
loaded on demand under a memory budget.

The policy. A request names a model (its name or an alias; unknown names raise
:class:`~llamapy.errors.UnknownModelError` listing what is served) and :meth:`acquire` returns a
lease on its server. An unloaded model is loaded on demand; requesters of a model that is
loading wait, bounded by their timeout (:class:`~llamapy.errors.NotReadyError` past it). The
budget is ``models_max`` resident models and ``memory_mb`` of estimated memory
(:func:`~llamapy.server.model_spec.estimate_memory_mb`); 0 means unlimited. A load that does
not fit unloads idle models, least recently used first, until it fits. A model with a lease or
a waiter is never unloaded: a load that cannot make room waits for a lease to end (then
:class:`~llamapy.errors.ModelBudgetError`), and fails at once if it can never fit (larger than
the budget, or the pinned models leave no room). Pinned models are never unloaded for room or
idleness. Once a model's last lease ends, ``keep_alive`` applies: 0 unloads it then, a finite
value unloads it after that many idle seconds (one reaper thread sleeps until the next
deadline; nothing polls), forever keeps it. A load failure is stored as the model's typed error
and raised to its requesters; it touches no other model; :meth:`load` retries it. An explicit
:meth:`unload` of a model in use happens when its last lease ends. A read-only view
:meth:`hold` s a loaded model without using it: no unload happens under it, and its keep-alive
clock runs on. ``on_idle_unload`` (the serving app's sleep snapshot) is called with each model
the idle TTL unloads, before its server is closed.

One lock and one condition guard every entry; loads and closes run outside the lock (a loader
thread per load closes the evicted servers first, then starts the new one and waits for it).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import (
    ClosedError,
    InvalidOptionError,
    LlamapyError,
    ModelBudgetError,
    NotReadyError,
    UnknownModelError,
)
from .budget import Entry, check_entries
from .lifecycle import Lifecycle
from .model_spec import (
    ModelLease,
    ModelSpec,
    ModelState,
    ModelStatus,
    ServerFactory,
    default_server_factory,
    estimate_memory_mb,
    parse_keep_alive,
)

__all__ = ["ModelManager"]

log = logging.getLogger("llamapy.server")


class ModelManager(Lifecycle):
    """Serve several models, each its own ``Server``, on demand under a memory budget.

    ``specs``: the models (:class:`ModelSpec`). ``models_max``: most models resident at once;
    ``memory_mb``: most estimated MiB resident (0 = unlimited, both). ``keep_alive``: default
    idle TTL for specs without their own (see :func:`parse_keep_alive`; -1 = keep).
    ``load_timeout``: default wait of :meth:`acquire` (None = unbounded). ``server_factory``
    makes a server from a spec (tests inject fakes). ``on_idle_unload(name, server)`` runs
    before the idle TTL unloads a model (with the manager's lock held: it must not call back
    into the manager). See the module docstring for the rules.
    """

    def __init__(self, specs: Iterable[ModelSpec] = (), *, models_max: int = 0,
                 memory_mb: float = 0.0, keep_alive: float | str = -1,
                 load_timeout: float | None = None,
                 server_factory: ServerFactory = default_server_factory,
                 on_idle_unload: Callable[[str, Any], None] | None = None) -> None:
        if isinstance(models_max, bool) or not isinstance(models_max, int) or models_max < 0:
            raise InvalidOptionError(f"models_max must be an int >= 0, got {models_max!r}",
                                     option="models_max")
        if not memory_mb >= 0:
            raise InvalidOptionError(f"memory_mb must be >= 0, got {memory_mb!r}",
                                     option="memory_mb")
        super().__init__(models_max, float(memory_mb), server_factory, on_idle_unload)
        self.keep_alive = parse_keep_alive(keep_alive)
        self.load_timeout = load_timeout
        self._by_name: dict[str, Entry] = {}
        for spec in specs:
            self.add(spec)
        self._reaper = threading.Thread(target=self._reap_loop, name="llamapy-models-reaper",
                                        daemon=True)
        self._reaper.start()

    # --- the served set -----------------------------------------------------------------------

    def add(self, spec: ModelSpec) -> None:
        """Serve one more model (unloaded until first used); a name already served raises."""
        keep = self.keep_alive if spec.keep_alive is None else parse_keep_alive(spec.keep_alive)
        entry = Entry(spec=spec, keep_alive=keep, memory_mb=estimate_memory_mb(spec),
                       pinned=spec.pinned)
        with self._cond:
            taken = [n for n in spec.names if n in self._by_name]
            if taken or len(set(spec.names)) != len(spec.names):
                raise InvalidOptionError(f"model name(s) already served: {taken or spec.names}",
                                         option="name")
            self._entries[spec.name] = entry
            self._by_name.update(dict.fromkeys(spec.names, entry))

    @property
    def names(self) -> list[str]:
        """The served models' names (aliases not included), in the order they were added."""
        with self._cond:
            return list(self._entries)

    def resolve(self, name: str) -> str:
        """The model's name for ``name`` (a name or an alias); unknown raises."""
        with self._cond:
            return self._entry(name).spec.name

    def spec(self, name: str) -> ModelSpec:
        """The spec of a model (by name or alias)."""
        with self._cond:
            return self._entry(name).spec

    def status(self) -> list[ModelStatus]:
        """A snapshot of every served model."""
        with self._cond:
            return [self._status(e) for e in self._entries.values()]

    def status_of(self, name: str) -> ModelStatus:
        """A snapshot of one model."""
        with self._cond:
            return self._status(self._entry(name))

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if the entries are inconsistent or over the budget."""
        with self._cond:
            check_entries(list(self._entries.values()), self.models_max, self.memory_mb)

    def pin(self, name: str, pinned: bool = True) -> None:
        """Pin (never unloaded for room or idleness) or unpin a model."""
        with self._cond:
            self._entry(name).pinned = pinned
            self._cond.notify_all()

    # --- leases -------------------------------------------------------------------------------

    def acquire(self, name: str, timeout: float | None = None) -> ModelLease:
        """A lease on the model's server, loading it first when needed.

        Waits at most ``timeout`` seconds (default ``load_timeout``) for the load or for room;
        raises :class:`UnknownModelError`, the model's stored load error,
        :class:`NotReadyError` (still loading) or :class:`ModelBudgetError` (no room).
        """
        with self._cond:
            entry = self._entry(name)
            server = self._hold(entry, self._deadline(timeout), retry=False)
        return ModelLease(entry.spec.name, server, lambda: self._release(entry))

    def try_acquire(self, name: str, *, blocking: bool = True) -> ModelLease | None:
        """A lease if the model is loaded now, else None (nothing started, never waits for a
        load). ``blocking=False`` also answers None while the manager's lock is held (an
        unload under way runs hooks under it), for a caller that must not wait at all."""
        if not self._cond.acquire(blocking=blocking):
            return None
        try:
            entry = self._entry(name)
            if entry.state is not ModelState.LOADED:
                return None
            entry.users += 1
            entry.last_used = time.monotonic()
        finally:
            self._cond.release()
        return ModelLease(entry.spec.name, entry.server, lambda: self._release(entry))

    def peek(self, name: str) -> Any | None:
        """The model's server if it is loaded now, else None: no lease, not counted as a use
        (its keep-alive clock runs on). For read-only status views, which must expect the
        server to close under them (its calls then raise :class:`~llamapy.errors.ClosedError`)."""
        with self._cond:
            entry = self._entry(name)
            return entry.server if entry.state is ModelState.LOADED else None

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[Any | None]:
        """The model's server if it is loaded now (None otherwise), kept loaded until the block
        ends: for a read-only view that must not see it closed under it. Not a use: its
        keep-alive clock runs on (an unload it held off happens when the block ends), and
        nothing is loaded. An idle unload under way is waited for."""
        with self._cond:
            entry = self._entry(name)
            server = entry.server if entry.state is ModelState.LOADED else None
            if server is not None:
                entry.holds += 1
        try:
            yield server
        finally:
            if server is not None:
                with self._cond:
                    entry.holds -= 1
                    self._cond.notify_all()

    def start(self, name: str) -> None:
        """Start loading an unloaded or failed model without waiting (with no room now, the
        first request for it waits for room instead)."""
        with self._cond:
            entry = self._entry(name)
            if entry.state in (ModelState.UNLOADED, ModelState.FAILED):
                self._start_load(entry)

    def wait_settled(self, name: str, timeout: float | None = None) -> ModelStatus:
        """Wait at most ``timeout`` seconds (None: as long as it takes) while the model is
        loading; its status after."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            entry = self._entry(name)
            while entry.state is ModelState.LOADING and self._wait(deadline):
                pass
            return self._status(entry)

    def failure(self, name: str) -> LlamapyError | None:
        """The typed error of a model whose load failed (None unless it is ``FAILED``)."""
        with self._cond:
            entry = self._entry(name)
            return entry.error if entry.state is ModelState.FAILED else None

    def load(self, name: str, timeout: float | None = None) -> ModelStatus:
        """Load a model now (retrying a failed one) and wait for it; its status after.

        The explicit load does not count as a use: ``keep_alive`` 0 does not unload it at
        once (a finite ``keep_alive`` starts counting now).
        """
        with self._cond:
            entry = self._entry(name)
            self._hold(entry, self._deadline(timeout), retry=True)
            entry.users -= 1
            entry.last_used = time.monotonic()
            self._cond.notify_all()
            return self._status(entry)

    def unload(self, name: str) -> ModelStatus:
        """Unload a model (pinned or not; a failed one forgets its error); one in use or
        loading is unloaded when its last lease ends. Its status after the call."""
        with self._cond:
            entry = self._entry(name)
            server = None
            if entry.state is ModelState.FAILED or (entry.state is ModelState.LOADED
                                                     and entry.users == 0):
                server = self._drop(entry)
            elif entry.state is not ModelState.UNLOADED:
                entry.unload_pending = True
            status = self._status(entry)
            self._cond.notify_all()
        if server is not None:
            server.close()
        return status

    def keep(self, name: str, keep_alive: float | str | None) -> ModelStatus:
        """Set how long a model stays loaded once idle (Ollama's per-request ``keep_alive``,
        see :func:`parse_keep_alive`; None: back to its configured one). It applies from the
        model's next idle moment: 0 unloads it when its last lease ends."""
        with self._cond:
            entry = self._entry(name)
            configured = entry.spec.keep_alive
            entry.keep_alive = parse_keep_alive(keep_alive) if keep_alive is not None else (
                self.keep_alive if configured is None else parse_keep_alive(configured))
            self._cond.notify_all()
            return self._status(entry)

    def close(self) -> None:
        """Unload every model and stop; later calls raise :class:`ClosedError`. Idempotent."""
        with self._cond:
            self._closed = True
            servers = [self._drop(e) for e in self._entries.values()
                       if e.state is ModelState.LOADED]
            self._cond.notify_all()
        if self._reaper is not threading.current_thread():
            self._reaper.join()
        for server in servers:
            server.close()
        with self._cond:
            pending = list(self._closers)
        for thread in pending:
            thread.join()

    def __enter__(self) -> ModelManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals (called with the lock held unless said otherwise) ---------------------------

    def _entry(self, name: str) -> Entry:
        if self._closed:
            raise ClosedError("the model manager is closed")
        entry = self._by_name.get(name)
        if entry is None:
            raise UnknownModelError(name, self._entries)
        return entry

    def _status(self, e: Entry) -> ModelStatus:
        return ModelStatus(name=e.spec.name, aliases=e.spec.aliases, path=str(e.spec.path),
                           state=e.state, error=None if e.error is None else str(e.error),
                           in_flight=e.users, pinned=e.pinned, keep_alive=e.keep_alive,
                           memory_mb=e.memory_mb)

    def _deadline(self, timeout: float | None) -> float | None:
        timeout = self.load_timeout if timeout is None else timeout
        return None if timeout is None else time.monotonic() + timeout

    def _hold(self, entry: Entry, deadline: float | None, *, retry: bool) -> Any:
        """Count a user on ``entry`` and wait until it is loaded; undo the count on failure."""
        entry.users += 1
        try:
            return self._wait_loaded(entry, deadline, retry)
        except BaseException:
            entry.users -= 1
            self._cond.notify_all()
            raise

    def _wait_loaded(self, entry: Entry, deadline: float | None, retry: bool) -> Any:
        while True:
            if self._closed:
                raise ClosedError("the model manager is closed")
            if entry.state is ModelState.LOADED:
                entry.last_used = time.monotonic()
                return entry.server
            if entry.state is ModelState.FAILED and not retry:
                assert entry.error is not None
                raise entry.error
            if entry.state is not ModelState.LOADING and self._start_load(entry):
                retry = False
                continue
            if not self._wait(deadline):
                if entry.state is ModelState.LOADING:
                    raise NotReadyError(f"model {entry.spec.name!r} is still loading")
                raise ModelBudgetError(f"no room to load model {entry.spec.name!r}: every "
                                       "loaded model is in use or pinned")
