"""Engine counters and the stats snapshot."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llamapy.engine.tenant_counts import TenantCounters

__all__ = ["REUSE_SOURCES", "TIERS", "Counters", "EngineStats", "InstabilityEvent", "SlotInfo"]

#: The engine's cache tiers, cheapest to restore from first.
TIERS = ("ram", "disk")
#: Where a run's reused prompt tokens come from: its own slot, a donor slot, a cache tier, or
#: adopted in flight from a slot computing the same prefix.
REUSE_SOURCES = ("own", "donor", *TIERS, "inflight")


@dataclass(slots=True, frozen=True)
class InstabilityEvent:
    """A prompt that matched only 10-50% of a long cached history of its own slot: usually a
    chat template rewriting earlier turns, which defeats prefix reuse."""

    request_id: Hashable
    slot_id: int
    cached_tokens: int
    matched_tokens: int
    prompt_tokens: int

    @property
    def matched_share(self) -> float:
        """Matched share of the cached history."""
        return self.matched_tokens / self.cached_tokens


@dataclass(slots=True, frozen=True)
class SlotInfo:
    """One slot in a stats snapshot: its state, cached prefix and current request.

    ``cache_scope`` is the sub-scope inside the slot's ``tenant``.
    ``num_computed_tokens``: the current request's tokens whose KV is in the slot (reused or
    computed; 0 until its prefix is resolved): a prefilling slot's progress is this over
    ``prompt_tokens``."""

    slot_id: int
    state: str
    cached_tokens: int
    cache_scope: str | None
    session: Hashable | None
    lease_id: int | None
    request_id: Hashable | None
    prompt_tokens: int
    generated_tokens: int
    num_computed_tokens: int = 0
    #: The tenant of the slot's cached KV (None: the default tenant).
    tenant: str | None = None
    #: Positions of the slot's context checkpoints and their bytes (a model whose state
    #: cannot be trimmed; :mod:`llamapy.engine.cache.checkpoints`).
    checkpoints: tuple[int, ...] = ()
    checkpoint_bytes: int = 0

    def as_dict(self) -> dict[str, object]:
        """A JSON-friendly dict (session and request id as ``repr``)."""
        out = asdict(self)
        for key in ("session", "request_id"):
            out[key] = None if out[key] is None else repr(out[key])
        return out


@dataclass(slots=True)
class Counters:
    """Monotonic engine counters (``num_*``)."""

    num_ticks: int = 0
    #: Decode steps chained inside a tick (a steady decode on an asynchronous device:
    #: :mod:`llamapy.engine.steady`).
    num_steady_steps: int = 0
    num_decode_calls: int = 0
    num_decode_slots: int = 0  # slots in each decode call, summed (busy slots per decode)
    num_submitted: int = 0
    num_rejected: int = 0
    num_finished: int = 0
    num_cancelled: int = 0
    num_errors: int = 0
    num_prompt_tokens: int = 0
    #: Prompt tokens reused, by source (:data:`REUSE_SOURCES`).
    reused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REUSE_SOURCES, 0))
    num_prefill_tokens: int = 0
    num_generated_tokens: int = 0
    #: Prefixes restored from each cache tier, and restores that failed (the entry vanished,
    #: was corrupt, too slow to read, or the backend refused it), by tier name.
    restores: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    restore_failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    num_disk_writes: int = 0  # the disk cache's writer counts them: read it from stats()
    num_purged_slots: int = 0
    num_parked_slots: int = 0
    num_kv_pressure_events: int = 0
    num_batch_splits: int = 0
    num_context_overflows: int = 0
    num_instability_events: int = 0
    num_checkpoints_taken: int = 0
    num_checkpoint_restores: int = 0
    num_checkpoint_tokens_behind: int = 0  # shared tokens computed again past a checkpoint
    num_adapter_switches: int = 0
    num_draft_tokens: int = 0
    num_draft_accepted: int = 0
    num_draft_steps: int = 0
    draft_accepted_per_pos: list[int] = field(default_factory=list)
    finish_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def num_reused_tokens(self) -> int:
        """Prompt tokens reused from any source."""
        return sum(self.reused.values())

    def flat(self) -> dict[str, object]:
        """The counters as one flat dict: the per-source and per-tier ones under their stats
        names (``num_reused_<source>``, ``num_<tier>_restores``,
        ``num_<tier>_restore_failures``; the disk's failures also as ``num_disk_failures``)."""
        out = asdict(self)
        for name in ("reused", "restores", "restore_failures"):
            del out[name]
        out.update({f"num_reused_{source}": n for source, n in self.reused.items()})
        out.update({f"num_{tier}_restores": n for tier, n in self.restores.items()})
        out.update({f"num_{tier}_restore_failures": n
                    for tier, n in self.restore_failures.items()})
        out["num_disk_failures"] = self.restore_failures.get("disk", 0)
        out["num_reused_tokens"] = self.num_reused_tokens
        return out

    def count_finish(self, reason: str) -> None:
        """Count one finished request by reason (``cancelled`` and ``error`` in their own
        counters too)."""
        self.finish_reasons[reason] = self.finish_reasons.get(reason, 0) + 1
        self.num_finished += 1
        if reason == "cancelled":
            self.num_cancelled += 1
        elif reason == "error":
            self.num_errors += 1


@dataclass(slots=True)
class EngineStats:
    """A snapshot of the engine (see :meth:`Engine.stats`)."""

    n_parallel: int
    n_batch: int
    n_ctx: int
    n_ctx_seq: int
    chunk_size: int
    max_queue: int
    batch_strategy: str
    slots_active: int
    slots_idle: int
    slots_leased: int
    slots_prefilling: int
    slots_decoding: int
    queue_depth: int
    ram_cache_entries: int
    ram_cache_bytes: int
    ram_cache_budget_bytes: int
    ram_cache_evictions: int
    ram_cache_pinned_bytes: int
    disk_cache_entries: int
    disk_cache_bytes: int
    disk_cache_budget_bytes: int
    disk_cache_evictions: int
    disk_cache_bad_files: int
    counters: Counters
    instability_events: list[InstabilityEvent]
    slots: list[SlotInfo] = field(default_factory=list)
    #: Each tenant's own counters (:mod:`llamapy.engine.tenant_counts`; None: the default
    #: tenant).
    tenants: dict[str | None, TenantCounters] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        """A JSON-friendly dict (counters flattened in; ``tenants`` as a list of each tenant's
        flat counters with its ``tenant``)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__
               if k not in ("counters", "instability_events", "slots", "tenants")}
        out.update(self.counters.flat())
        out["slots"] = [slot.as_dict() for slot in self.slots]
        out["tenants"] = [{"tenant": tenant, **counters.flat()}
                          for tenant, counters in self.tenants.items()]
        out["instability_events"] = [
            {**asdict(e), "request_id": repr(e.request_id)} for e in self.instability_events
        ]
        return out


def recent_events(maxlen: int = 32) -> deque[InstabilityEvent]:
    """A bounded buffer for the latest instability events."""
    return deque(maxlen=maxlen)
