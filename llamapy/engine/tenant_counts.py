"""What each tenant's own requests did: the engine's request and token counters, by tenant.

The engine's :class:`~llamapy.engine.stats.Counters` are the server's totals: a view shown to
one tenant must not carry them, as two readings around a request of another tenant tell its
prompt and output sizes. :class:`TenantCounts` keeps, per tenant (``RequestOptions.tenant``;
None is the default tenant), the same counters over that tenant's requests only:

- at submission: ``num_submitted`` and ``num_prompt_tokens``; a submission refused for a full
  queue or a busy tenant: ``num_rejected``;
- at the end of a request: ``num_finished`` (``num_cancelled``, ``num_errors``), and from the
  run's timings its computed prompt tokens (``num_prefill_tokens``), generated tokens, reused
  prompt tokens by source (``reuse_source`` and the in-flight adoptions) and its time to
  first token (``ttft_sum_s`` / ``ttft_count``).

:meth:`TenantCounts.snapshot` adds the requests still active (their tokens so far, and
``num_queued``, those waiting for a slot), so a tenant's counters move while its requests run,
as the totals do, and every count in a snapshot is of that tenant's requests alone. At most
:data:`MAX_TENANTS` tenants are remembered (the least recently counted is forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from llamapy.engine.request import Run
from llamapy.engine.states import RequestState
from llamapy.engine.stats import REUSE_SOURCES, Counters

__all__ = ["MAX_TENANTS", "TenantCounters", "TenantCounts"]

#: Tenants whose counters are remembered at once.
MAX_TENANTS = 1024


@dataclass(slots=True)
class TenantCounters:
    """One tenant's counters, named as the engine's totals are (see the module)."""

    num_submitted: int = 0
    num_rejected: int = 0
    num_finished: int = 0
    num_cancelled: int = 0
    num_errors: int = 0
    num_queued: int = 0
    num_prompt_tokens: int = 0
    num_prefill_tokens: int = 0
    num_generated_tokens: int = 0
    #: Prompt tokens reused, by source (:data:`~llamapy.engine.stats.REUSE_SOURCES`).
    reused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REUSE_SOURCES, 0))
    ttft_sum_s: float = 0.0
    ttft_count: int = 0

    def add_run(self, run: Run) -> None:
        """Add what ``run`` computed, generated and reused so far, and its first token."""
        timings = run.timings
        self.num_prefill_tokens += timings.prefill_tokens
        self.num_generated_tokens += run.num_generated
        if timings.reuse_source in self.reused:
            self.reused[timings.reuse_source] += timings.reused_tokens
        self.reused["inflight"] += timings.inflight_tokens
        if timings.ttft_s is not None:
            self.ttft_sum_s += timings.ttft_s
            self.ttft_count += 1

    def copy(self) -> TenantCounters:
        """An independent copy."""
        out = TenantCounters(**{k: v for k, v in asdict(self).items() if k != "reused"})
        out.reused = dict(self.reused)
        return out

    def flat(self) -> dict[str, float]:
        """The counters as a flat dict, reuse as ``num_reused_<source>`` (the stats' names)."""
        out: dict[str, float] = {k: v for k, v in asdict(self).items() if k != "reused"}
        out.update({f"num_reused_{source}": n for source, n in self.reused.items()})
        return out


class TenantCounts:
    """The counters of each tenant's ended requests, and their snapshot (see the module)."""

    def __init__(self, max_tenants: int = MAX_TENANTS) -> None:
        self.max_tenants = max_tenants
        self._by_tenant: OrderedDict[str | None, TenantCounters] = OrderedDict()

    def _of(self, tenant: str | None) -> TenantCounters:
        counters = self._by_tenant.pop(tenant, None) or TenantCounters()
        self._by_tenant[tenant] = counters  # (most recently counted last)
        while len(self._by_tenant) > self.max_tenants:
            self._by_tenant.popitem(last=False)
        return counters

    def submitted(self, run: Run) -> None:
        """``run`` was accepted."""
        counters = self._of(run.request.options.tenant)
        counters.num_submitted += 1
        counters.num_prompt_tokens += len(run.prompt)

    def rejected(self, tenant: str | None) -> None:
        """A request of ``tenant`` was refused for a full queue or a busy tenant."""
        self._of(tenant).num_rejected += 1

    def finished(self, run: Run, reason: str) -> None:
        """``run`` ended with ``reason`` (a ``FinishReason`` value)."""
        counters = self._of(run.request.options.tenant)
        counters.num_finished += 1
        counters.num_cancelled += reason == "cancelled"
        counters.num_errors += reason == "error"
        counters.add_run(run)

    def snapshot(self, active: Iterable[Run]) -> dict[str | None, TenantCounters]:
        """Each tenant's counters, with its ``active`` runs (not finished) added."""
        out = {tenant: counters.copy() for tenant, counters in self._by_tenant.items()}
        for run in active:
            counters = out.setdefault(run.request.options.tenant, TenantCounters())
            counters.add_run(run)
            counters.num_queued += run.state is RequestState.QUEUED
        return out

    def check_integrity(self, totals: Counters) -> None:
        """Raise ``AssertionError`` unless, while no tenant was forgotten, the tenants'
        submitted, rejected and finished requests add up to the engine's ``totals``."""
        if len(self._by_tenant) >= self.max_tenants:
            return
        for name in ("num_submitted", "num_rejected", "num_finished", "num_cancelled",
                     "num_errors", "num_prompt_tokens"):
            mine = sum(getattr(c, name) for c in self._by_tenant.values())
            if mine != getattr(totals, name):
                raise AssertionError(f"tenant counts: {name} of the tenants {mine} != "
                                     f"{getattr(totals, name)}")
