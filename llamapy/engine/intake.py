"""Taking a request in: checked, placed (a free slot at once, or the queue), made a run.

:meth:`Intake.take` does everything :meth:`~llamapy.engine.engine.Engine.submit` must do before
the engine records the run, and changes nothing the engine keeps when it raises: the request
is checked against the backend and the runs already known, its tenant's request bound and the
queue bound are applied (a refusal counted once), its adapter set is loaded and its sampler
built (one built here is closed again if the run cannot be made; one the caller built ahead is
the caller's to close).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from llamapy.engine.admission import Admission, check_request, effective_cache_prompt
from llamapy.engine.backend import Backend, Sampler
from llamapy.engine.options import EngineConfig
from llamapy.engine.request import Request, Run
from llamapy.engine.slots import Slot, SlotPool
from llamapy.engine.speculation.speculator import Speculator
from llamapy.engine.stats import Counters
from llamapy.engine.tenant_counts import TenantCounts
from llamapy.engine.tenants import Tenants
from llamapy.engine.text import TextStream
from llamapy.errors import QueueFullError

__all__ = ["Intake"]


class Intake:
    """Turns a submitted request into its run and the slot it takes (see the module)."""

    def __init__(self, backend: Backend, config: EngineConfig, pool: SlotPool,
                 admission: Admission, tenants: Tenants, tenant_counts: TenantCounts,
                 counters: Counters, speculator: Speculator,
                 clock: Callable[[], float]) -> None:
        self.backend = backend
        self.config = config
        self.pool = pool
        self.admission = admission
        self.tenants = tenants
        self.tenant_counts = tenant_counts
        self.counters = counters
        self.speculator = speculator
        self.clock = clock
        self._serial = 0

    def take(self, request: Request, runs: dict[Hashable, Run], queue: list[Run]
             ) -> tuple[Run, Slot | None]:
        """The run of ``request`` and the slot it takes now (None: it queues); raises as
        :meth:`~llamapy.engine.engine.Engine.submit` documents."""
        prompt = check_request(request, self.backend, self.pool, runs, self.config)
        slot = self._placement(request, prompt, queue)
        if request.adapter_set:
            self.backend.load_adapters(request.adapter_set)
        sampler = request.sampler
        if sampler is None and request.options.max_tokens > 0:
            sampler = self.backend.new_sampler(request.options.sampling)
        try:
            run = self._new_run(request, prompt, sampler)
            self.speculator.start(run)
        except BaseException:
            if sampler is not None and sampler is not request.sampler:
                sampler.close()  # (the caller closes a sampler built ahead)
            raise
        request.sampler = None  # the run owns it now
        return run, slot

    def _placement(self, request: Request, prompt: list[int], queue: list[Run]
                   ) -> Slot | None:
        """The slot a new request takes right away, None to queue it; ``TenantBusyError``,
        ``QueueFullError``."""
        try:
            self.tenants.check(request)
            probe = Run(request, -1, self._cache_prompt(request), None, 0.0, prompt=prompt)
            slot = self.admission.placement(probe, queue)
            if slot is None and 0 < self.config.max_queue <= len(queue):
                self.counters.num_rejected += 1
                raise QueueFullError(self.config.max_queue)
        except QueueFullError:  # (TenantBusyError too)
            self.tenant_counts.rejected(request.options.tenant)
            raise
        return slot

    def _cache_prompt(self, request: Request) -> bool:
        return effective_cache_prompt(request, self.config.cache_prompt)

    def _new_run(self, request: Request, prompt: list[int], sampler: Sampler | None) -> Run:
        self._serial += 1
        now = self.clock()
        run = Run(request, self._serial, self._cache_prompt(request), sampler, now,
                  prompt=prompt, tokens=list(prompt),
                  text=TextStream(stop=request.options.stop))
        run.timings.submitted_at = now
        run.timings.prompt_tokens = len(run.prompt)
        self.counters.num_submitted += 1
        self.counters.num_prompt_tokens += len(run.prompt)
        self.tenant_counts.submitted(run)
        return run
