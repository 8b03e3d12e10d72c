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
:meth:`unload` of a model in use happens when its last lease ends.

One lock and one condition guard every entry; loads and closes run outside the lock (a loader
thread per load closes the evicted servers first, then starts the new one and waits for it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from ..errors import (
    ClosedError,
    InvalidOptionError,
    LlamapyError,
    LoadFailedError,
    ModelBudgetError,
    NotReadyError,
    UnknownModelError,
)
from .budget import Entry, check_entries, plan_room
from .model_spec import (
    KEEP_FOREVER,
    ModelLease,
    ModelSpec,
    ModelState,
    ModelStatus,
    ServerFactory,
    ServerLike,
    default_server_factory,
    estimate_memory_mb,
    parse_keep_alive,
)

__all__ = ["ModelManager"]


class ModelManager:
    """Serve several models, each its own ``Server``, on demand under a memory budget.

    ``specs``: the models (:class:`ModelSpec`). ``models_max``: most models resident at once;
    ``memory_mb``: most estimated MiB resident (0 = unlimited, both). ``keep_alive``: default
    idle TTL for specs without their own (see :func:`parse_keep_alive`; -1 = keep).
    ``load_timeout``: default wait of :meth:`acquire` (None = unbounded). ``server_factory``
    makes a server from a spec (tests inject fakes). See the module docstring for the rules.
    """

    def __init__(self, specs: Iterable[ModelSpec] = (), *, models_max: int = 0,
                 memory_mb: float = 0.0, keep_alive: float | str = -1,
                 load_timeout: float | None = None,
                 server_factory: ServerFactory = default_server_factory) -> None:
        if isinstance(models_max, bool) or not isinstance(models_max, int) or models_max < 0:
            raise InvalidOptionError(f"models_max must be an int >= 0, got {models_max!r}",
                                     option="models_max")
        if not memory_mb >= 0:
            raise InvalidOptionError(f"memory_mb must be >= 0, got {memory_mb!r}",
                                     option="memory_mb")
        self.models_max = models_max
        self.memory_mb = float(memory_mb)
        self.keep_alive = parse_keep_alive(keep_alive)
        self.load_timeout = load_timeout
        self._factory = server_factory
        self._cond = threading.Condition()
        self._entries: dict[str, Entry] = {}
        self._by_name: dict[str, Entry] = {}
        self._closed = False
        self._closers: set[threading.Thread] = set()
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

    def try_acquire(self, name: str) -> ModelLease | None:
        """A lease if the model is loaded now, else None (nothing started, never waits)."""
        with self._cond:
            entry = self._entry(name)
            if entry.state is not ModelState.LOADED:
                return None
            entry.users += 1
            entry.last_used = time.monotonic()
        return ModelLease(entry.spec.name, entry.server, lambda: self._release(entry))

    def peek(self, name: str) -> Any | None:
        """The model's server if it is loaded now, else None: no lease, not counted as a use
        (its keep-alive clock runs on). For read-only status views, which must expect the
        server to close under them (its calls then raise :class:`~llamapy.errors.ClosedError`)."""
        with self._cond:
            entry = self._entry(name)
            return entry.server if entry.state is ModelState.LOADED else None

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

    def _wait(self, deadline: float | None) -> bool:
        if deadline is None:
            self._cond.wait()
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self._cond.wait(remaining)
        return True

    def _start_load(self, entry: Entry) -> bool:
        """Make room and start loading ``entry``; False when no room can be made yet."""
        victims = plan_room(self._entries.values(), entry, self.models_max, self.memory_mb)
        if victims is None:
            return False
        evicted = [self._drop(v) for v in victims]
        entry.move(ModelState.LOADING)
        entry.error = None
        threading.Thread(target=self._load, args=(entry, evicted), daemon=True,
                         name=f"llamapy-load-{entry.spec.name}").start()
        return True

    def _drop(self, entry: Entry) -> Any:
        """Mark ``entry`` unloaded; return its server for the caller to close unlocked."""
        entry.move(ModelState.UNLOADED)
        server, entry.server = entry.server, None
        entry.error = None
        entry.unload_pending = False
        return server

    def _idle_drop(self, entry: Entry) -> Any:
        """The server to close now that ``entry`` has no users (keep_alive 0 or a pending
        unload), else None."""
        if entry.users or entry.state is not ModelState.LOADED:
            return None
        if entry.unload_pending or (entry.keep_alive == 0 and not entry.pinned):
            return self._drop(entry)
        return None

    def _release(self, entry: Entry) -> None:
        """A lease ended (called unlocked)."""
        with self._cond:
            entry.users -= 1
            entry.last_used = time.monotonic()
            self._close_later([self._idle_drop(entry)])
            self._cond.notify_all()

    def _close_later(self, servers: list[Any]) -> None:
        """Close ``servers`` on a thread of their own (called with the lock held), so a lease
        released on an event loop never waits for it; the next load waits for it instead."""
        servers = [s for s in servers if s is not None]
        if servers:
            thread = threading.Thread(target=self._close_all, args=(servers,), daemon=True,
                                      name="llamapy-unload")
            self._closers.add(thread)
            thread.start()

    def _close_all(self, servers: list[Any]) -> None:
        try:
            for server in servers:
                server.close()
        finally:
            with self._cond:
                self._closers.discard(threading.current_thread())
                self._cond.notify_all()

    def _load(self, entry: Entry, evicted: list[Any]) -> None:
        """Loader thread (unlocked): close the evicted servers and wait for the unloads under
        way (their memory must be free first), then start and await ours."""
        for old in evicted:
            if old is not None:
                old.close()
        with self._cond:
            pending = list(self._closers)
        for thread in pending:
            thread.join()
        server: ServerLike | None = None
        error: LlamapyError | None = None
        try:
            server = self._factory(entry.spec)
            server.wait_ready(None)
        except Exception as exc:  # stored as the model's typed error
            error = exc if isinstance(exc, LlamapyError) else LoadFailedError(exc)
            if server is not None:
                server.close()
                server = None
        self._finish_load(entry, server, error)

    def _finish_load(self, entry: Entry, server: ServerLike | None,
                     error: LlamapyError | None) -> None:
        with self._cond:
            closing = server if self._closed else None
            if error is not None or self._closed:
                entry.move(ModelState.FAILED)
                entry.error = error or ClosedError("the model manager is closed")
            else:
                entry.move(ModelState.LOADED)
                entry.server = server
                entry.last_used = time.monotonic()
                closing = self._idle_drop(entry)
            self._cond.notify_all()
        if closing is not None:
            closing.close()

    # --- idle TTL -----------------------------------------------------------------------------

    def _reap_loop(self) -> None:
        """Reaper thread: unload models idle past their keep_alive; sleeps until the next
        deadline or until a lease changes."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                expired = [self._drop(e) for e in self._entries.values()
                           if e.evictable and 0 < e.keep_alive <= now - e.last_used]
                self._close_later(expired)
                if not expired:
                    self._cond.wait(self._next_expiry(now))

    def _next_expiry(self, now: float) -> float | None:
        """Seconds until the next idle model's keep_alive runs out (None: no such model)."""
        deadlines = [e.last_used + e.keep_alive - now for e in self._entries.values()
                     if e.evictable and 0 < e.keep_alive < KEEP_FOREVER]
        return max(min(deadlines), 0.0) if deadlines else None
