"""The engine: a queue, slots, and a tick that drives the backend.

Not thread-safe: one thread (the server's tick thread) owns an :class:`Engine` and calls every
method, sinks included. One :meth:`Engine.tick` is::

    admit -> resolve prefixes -> plan batch -> decode -> sample and emit -> reap

Every request ends with exactly one final event (:class:`~llamapy.engine.request.DoneEvent` or
:class:`~llamapy.engine.request.ErrorEvent`). ``tick`` never raises to its owner (except
``ClosedError`` on a closed engine): a failure while admitting fails the queued runs it was
ordering, a failure while planning or decoding (a broken strategy, a foreign error from the
backend) fails the runs on slots with :class:`~llamapy.errors.EngineError`, their KV resynced
to what the engine knows, and the next tick serves the rest.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping

from llamapy.engine.admission import Admission, batch_limit, check_backend
from llamapy.engine.backend import Backend
from llamapy.engine.cache.disk import CacheNamespace, open_disk_cache
from llamapy.engine.cache.ram import open_ram_cache
from llamapy.engine.cache.resolver import PrefixResolver
from llamapy.engine.executor import Executor
from llamapy.engine.intake import Intake
from llamapy.engine.integrity import build_stats, check_engine
from llamapy.engine.kv_ops import KvOps
from llamapy.engine.options import EngineConfig, EngineTuning
from llamapy.engine.planner import Planner, ScheduledBatch
from llamapy.engine.request import CacheKey, Event, FinishReason, Request, Run, TokenEvent
from llamapy.engine.slots import Slot, SlotPool
from llamapy.engine.speculation.drafting import Drafter
from llamapy.engine.speculation.speculator import Speculator, with_ngram
from llamapy.engine.states import RequestState, SlotState
from llamapy.engine.stats import Counters, EngineStats, InstabilityEvent, recent_events
from llamapy.engine.steady import SteadyChain
from llamapy.engine.strategies import resolve_strategy
from llamapy.engine.tenant_counts import TenantCounts
from llamapy.engine.tenants import Tenants
from llamapy.errors import ClosedError, EngineError, LlamapyError

__all__ = ["Engine"]

log = logging.getLogger("llamapy.engine")


class Engine:
    """Continuous batching over a :class:`~llamapy.engine.backend.Backend`.

    ``drafters`` adds speculative drafters by name (``"draft"``: a
    :class:`~llamapy.engine.speculation.model_drafter.ModelDrafter`); the ``"ngram"`` drafter
    is built in.
    The engine closes them with itself. ``cache_namespace`` names the model and runtime for the
    disk prompt cache (required with ``config.prompt_cache_dir``: only the host knows them).
    """

    def __init__(self, backend: Backend, config: EngineConfig | None = None, *,
                 tuning: EngineTuning | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 drafters: Mapping[str, Drafter] | None = None,
                 cache_namespace: CacheNamespace | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.tuning = tuning = tuning or EngineTuning()
        check_backend(backend, config)
        self.backend = backend
        self.clock = clock
        self.n_batch = batch_limit(backend, config)
        self.strategy = resolve_strategy(config.batch_strategy)
        self.counters = Counters()
        self.instability_events: deque[InstabilityEvent] = recent_events()
        self.pool = SlotPool(config.n_parallel, min_route_share=config.slot_prompt_similarity,
                             clock=clock)
        self._open_caches(cache_namespace)
        chunk = self.n_batch if backend.pools else config.chunk_size  # (prompts go whole)
        self.planner = Planner(self.strategy, self.n_batch, chunk,
                               lambda: self.speculator.cost.pass_tokens)
        self.tenants = Tenants.of(config, self.counters)
        #: The request and token counters of each tenant's own requests.
        self.tenant_counts = TenantCounts()
        self.admission = Admission(self.pool, self.prefix, self.strategy, clock, self.tenants)
        self.speculator = Speculator(backend, self.counters,
                                     with_ngram(config.spec_ngram_size, drafters),
                                     config.speculative, tuning.spec_prior_beta)
        self.executor = Executor(backend, self.prefix, self.counters, clock, self._deliver,
                                 self.speculator, config.max_sample_ms / 1000)
        #: What a submitted request becomes (its run, its slot or the queue).
        self.intake = Intake(backend, config, self.pool, self.admission, self.tenants,
                             self.tenant_counts, self.counters, self.speculator, clock)
        #: The tick's batch and the steady decode steps chained after it.
        self.steady = SteadyChain(self.executor, self.counters, tuning.steady_steps)
        #: KV operations on leased slots (save, restore, clear, next-token logits).
        self.leases = KvOps(backend, self.pool, self.prefix, leased=True)
        #: KV operations on idle slots (save, restore, clear: llama-server's slot actions).
        self.slot_ops = KvOps(backend, self.pool, self.prefix, leased=False)
        self._queue: list[Run] = []
        self._runs: dict[Hashable, Run] = {}
        self._gone: list[Run] = []
        self._closed = False

    def _open_caches(self, cache_namespace: CacheNamespace | None) -> None:
        """The disk and RAM prompt caches and the prefix resolver over them and the slots."""
        config, tuning = self.config, self.tuning
        self.disk = open_disk_cache(config, tuning, cache_namespace)
        self.ram = open_ram_cache(config, tuning, self.disk.offer_entry, self.clock)
        self.prefix = PrefixResolver(self.backend, self.pool, self.ram, self.counters, tuning,
                                     self.instability_events.append, self.disk, config)

    # --- submission ----------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queue ``request`` (or place it on a free slot at once).

        Raises, changing nothing: ``ClosedError``, ``InvalidOptionError`` (duplicate id, bad
        tokens, empty prompt), ``UnknownLeaseError``, ``ContextOverflowError`` (prompt plus
        ``max_tokens`` cannot fit the per-sequence context), ``TenantBusyError`` (the
        request's tenant holds ``tenant_max_requests``), ``QueueFullError``,
        ``PermissionDeniedError`` (its ``slot_id`` names a slot holding another tenant's
        request, lease or KV),
        ``GrammarError`` (from the backend's sampler), ``ModelLoadError`` (an adapter set the
        backend cannot load).
        Any other exception (a bug, or a foreign error from the backend) becomes
        ``EngineError("submit", ...)``, with nothing of the request left behind.
        """
        try:
            self._check_open()
            self._submit(request)
        except LlamapyError:
            if request.sampler is not None:
                request.sampler.close()
            raise
        except Exception as exc:
            log.exception("submit of request %r failed", getattr(request, "request_id", None))
            if request.sampler is not None:
                request.sampler.close()
            raise EngineError("submit", exc) from exc

    def _submit(self, request: Request) -> None:
        run, slot = self.intake.take(request, self._runs, self._queue)
        self._runs[request.request_id] = run
        self.tenants.added(run)
        self._queue.append(run)
        if slot is not None:
            self._start(run, slot)

    # --- cancellation --------------------------------------------------------------------------

    def cancel(self, request_id: Hashable) -> bool:
        """Cancel a queued or running request: its slot is freed at once (its prefix retained
        per ``cache_prompt``) and it ends with ``finish_reason="cancelled"``. False if the id is
        not active."""
        run = self._runs.get(request_id)
        if run is None:
            return False
        self._finish(run, FinishReason.CANCELLED)
        return True

    # --- the tick ------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """Whether :meth:`tick` can make progress: a slot is running or a queued request can
        take a slot now. (Requests waiting for a leased slot or for slots held by leases do not
        count: a server should block until the next submission, cancel or release.)"""
        if self.pool.any_running():
            return True
        return any(self.admission.could_start(r) for r in self._queue)

    def tick(self, keep_going: Callable[[], bool] = lambda: True) -> bool:
        """Run one scheduling step; False (doing nothing) when there is no work. On an
        asynchronous device a steady decode chains up to ``steady_steps`` steps while
        ``keep_going()`` (the owner has nothing for the engine: :mod:`.steady`)."""
        self._check_open()
        if not self.has_work:
            return False
        self.counters.num_ticks += 1
        try:
            self._admit()
        except Exception as exc:  # a strategy's admission_order: fail what it was ordering
            self._fail_runs(list(self._queue), "admission", exc)
        try:
            waiting = self._resolve_prefixes()
            batch = self._plan_batch(waiting)
            if batch is not None:
                self.prefix.park_idle()
                self.speculator.extend(batch, self.n_batch, self.backend.n_ctx_seq)
                self.steady.execute(batch, self._may_chain(batch), keep_going)
            else:  # nothing to decode: block briefly on a pending disk read, do not spin
                self.executor.flush()
                self.prefix.wait()
        except Exception as exc:  # planning or decoding: fail the runs on slots
            self._fail_runs([s.run for s in self.pool.running() if s.run], "tick", exc)
        self._reap()
        return True

    def _may_chain(self, batch: ScheduledBatch) -> bool:
        """Whether a steady chain may follow ``batch`` (:mod:`.steady`): an asynchronous
        device, a strategy that decodes every slot, every running slot in ``batch``, nothing
        queued or cancelled."""
        return (self.backend.async_decode and self.planner.plain and not self._queue
                and not self._gone and len(batch.entries) == len(self.pool.running()))

    def _fail_runs(self, runs: list[Run], phase: str, exc: Exception) -> None:
        """End ``runs`` with a typed error after a failure in ``phase`` (KV resynced)."""
        refused = isinstance(exc, LlamapyError) and exc.http_status < 500  # the request's own
        log.log(logging.INFO if refused else logging.ERROR,
                "engine %s failed; failing %d request(s): %r", phase, len(runs), exc)
        error = exc if isinstance(exc, LlamapyError) else EngineError(phase, exc)
        for run in runs:
            if run.slot is not None:
                self.prefix.resync(run.slot)
            if run.state is not RequestState.FINISHED:
                self._finish(run, FinishReason.ERROR, error)

    def _admit(self) -> None:
        """Place queued runs: lease-bound, pinned (``slot_id``) and affine (``session``) first,
        then strategy order. A run whose routing raises ends alone."""
        for run in self.admission.order(self._queue, self._fail_runs):
            try:
                slot = None if self.admission.capped(run) else self.pool.route(run)
                if slot is not None:
                    self._start(run, slot)
            except Exception as exc:
                self._fail_runs([run], "admission", exc)

    def _start(self, run: Run, slot: Slot) -> None:
        self._queue.remove(run)
        self.pool.assign(run, slot)
        self.tenants.granted(run, slot)
        run.machine.fire("admit")
        run.admitted_at = self.clock()
        run.timings.queued_s = run.admitted_at - run.submitted_at

    def _resolve_prefixes(self) -> set[int]:
        """Apply reuse for newly placed runs, then in-flight dedup; returns the slots that wait
        this tick (for another slot to compute their prefix, or for a disk read)."""
        runs = sorted((s.run for s in self.pool.slots if s.run is not None),
                      key=lambda r: r.serial)
        waiting = set()
        for run in runs:
            if not run.resolved and not self.prefix.resolve(run) and run.slot is not None:
                waiting.add(run.slot.slot_id)
        for run in runs:
            slot = run.slot
            if slot is None or slot.state is not SlotState.PREFILLING or run.ending \
                    or not run.resolved:
                continue
            if self.prefix.follow(run):
                waiting.add(slot.slot_id)
            elif run.prefill_only and slot.remaining_prefill == 0:
                run.end(FinishReason.PREFILL)
        return waiting

    def _plan_batch(self, waiting: set[int]) -> ScheduledBatch | None:
        decoding, prefilling = [], []
        for slot in self.pool.running():
            if slot.run is None or slot.run.ending:
                continue
            if slot.state is SlotState.DECODING:
                decoding.append(slot)
            elif slot.slot_id not in waiting and slot.remaining_prefill > 0:
                prefilling.append(slot)
        return self.planner.schedule(decoding, prefilling, self._queue, self.clock())

    def _reap(self) -> None:
        for slot in self.pool.running():
            run = slot.run
            if run is not None and run.ending and run.finish is not None:
                self._finish(run, run.finish, run.error)
        gone, self._gone = self._gone, []
        for run in gone:
            if run.state is not RequestState.FINISHED:
                self._finish(run, FinishReason.CANCELLED)

    # --- finishing -----------------------------------------------------------------------------

    def _finish(self, run: Run, reason: FinishReason, error: LlamapyError | None = None) -> None:
        """Free what ``run`` holds and send its one final event."""
        if run.state is RequestState.FINISHED:
            return
        self.executor.flush_run(run)
        slot = run.slot
        if slot is not None:
            if not run.cache_prompt and run.resolved:
                self.prefix.trim(slot, 0)
            self.pool.unassign(slot)
        elif run in self._queue:
            self._queue.remove(run)
        run.machine.fire("finish")
        del self._runs[run.request_id]
        self.tenants.removed(run)
        self.prefix.forget(run.serial)
        self.speculator.finished(run)
        if run.sampler is not None:
            run.sampler.close()
        run.timings.completion_tokens = run.num_generated
        run.timings.finish_reason = reason.value
        self.counters.count_finish(reason.value)
        self.tenant_counts.finished(run, reason.value)
        self._deliver(run, run.final_event(reason, error))

    def _deliver(self, run: Run, event: Event) -> None:
        try:
            alive = run.request.sink(event)
        except Exception:  # a consumer's bug must not break the tick
            log.exception("sink of request %r raised; cancelling it", run.request_id)
            alive = False
        if alive is False and isinstance(event, TokenEvent):
            self._gone.append(run)
            if run.state is RequestState.RUNNING:  # a verification emits nothing more to it
                run.end(FinishReason.CANCELLED)

    # --- leases (for workspace sessions) -------------------------------------------------------

    def lease(self, cache_scope: str | None = None, cache_identity: str = "",
              adapter_set: tuple[Hashable, ...] = (), tenant: str | None = None,
              salt: str | None = None, *, idle_s: float | None = None,
              on_expire: Callable[[], None] | None = None) -> int | None:
        """Lease an idle slot for a session: it is never routed to other requests, purged or
        evicted until :meth:`release`, or until it sits idle ``idle_s`` seconds (then
        :func:`~llamapy.engine.lease_idle.reclaim_idle_leases` releases it and calls
        ``on_expire``). Returns the lease id, or None when no slot is idle.
        A cache under another key is dropped (offered to the RAM cache first). Requests on the
        lease should carry the same key (``cache_scope``, ``cache_identity``, ``tenant``,
        ``salt_digest(cache_salt) == salt`` and ``options.adapters == adapter_set``: the fields
        of :class:`CacheKey`, in its order); one that does not finds no KV to reuse. Between
        requests, the lease's KV is only touched through :attr:`leases`."""
        self._check_open()
        key = CacheKey(cache_scope, cache_identity, tuple(adapter_set), tenant, salt)
        slot = self.pool.lease(key, idle_s=idle_s, on_expire=on_expire)
        if slot is None:
            return None
        if slot.key != key:
            self.prefix.discard(slot, 0)
            slot.key = key
        return slot.lease_id

    def release(self, lease_id: int) -> None:
        """End a lease; requests still running or queued on it are cancelled first. The KV
        stays as an ordinary cached prefix in the lease's scope."""
        slot = self.pool.leased_slot(lease_id)
        for run in [r for r in self._runs.values() if r.request.lease_id == lease_id]:
            self._finish(run, FinishReason.CANCELLED)
        assert slot.is_free, "release: lease still running"
        self.pool.release(lease_id)

    # --- introspection and shutdown --------------------------------------------------------------

    @property
    def n_ctx_seq(self) -> int:
        """Tokens one sequence (slot) may hold."""
        return self.backend.n_ctx_seq

    def stats(self) -> EngineStats:
        """A snapshot of slots, queue, RAM cache and counters."""
        return build_stats(self)

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if any engine invariant is broken."""
        check_engine(self)

    @property
    def queue(self) -> list[Run]:
        """Runs waiting for a slot (read-only use)."""
        return list(self._queue)

    @property
    def runs(self) -> dict[Hashable, Run]:
        """Active runs by request id (read-only use)."""
        return dict(self._runs)

    def close(self) -> None:
        """End every active request with ``ClosedError`` and close their samplers, then the
        prefix caches (see :meth:`PrefixResolver.close`); idempotent. The backend is not closed
        (its owner does that)."""
        if self._closed:
            return
        self._closed = True
        for run in sorted(self._runs.values(), key=lambda r: r.serial):
            self._finish(run, FinishReason.ERROR, ClosedError("engine closed"))
        self.speculator.close()
        self.prefix.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("engine is closed")

