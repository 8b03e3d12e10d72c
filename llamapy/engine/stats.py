"""Engine counters and the stats snapshot."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field

__all__ = ["Counters", "EngineStats", "InstabilityEvent", "SlotInfo"]


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
    num_decode_calls: int = 0
    num_decode_slots: int = 0  # slots in each decode call, summed (busy slots per decode)
    num_submitted: int = 0
    num_rejected: int = 0
    num_finished: int = 0
    num_cancelled: int = 0
    num_errors: int = 0
    num_prompt_tokens: int = 0
    num_reused_own: int = 0
    num_reused_donor: int = 0
    num_reused_ram: int = 0
    num_reused_disk: int = 0
    num_reused_inflight: int = 0
    num_prefill_tokens: int = 0
    num_generated_tokens: int = 0
    num_ram_restores: int = 0
    num_ram_restore_failures: int = 0
    num_disk_writes: int = 0  # the disk cache's writer counts them: read it from stats()
    num_disk_restores: int = 0
    num_disk_failures: int = 0
    num_purged_slots: int = 0
    num_parked_slots: int = 0
    num_kv_pressure_events: int = 0
    num_batch_splits: int = 0
    num_context_overflows: int = 0
    num_instability_events: int = 0
    num_adapter_switches: int = 0
    num_draft_tokens: int = 0
    num_draft_accepted: int = 0
    num_draft_steps: int = 0
    draft_accepted_per_pos: list[int] = field(default_factory=list)
    finish_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def num_reused_tokens(self) -> int:
        """Prompt tokens reused from any source."""
        return (self.num_reused_own + self.num_reused_donor + self.num_reused_ram
                + self.num_reused_disk + self.num_reused_inflight)

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

    def as_dict(self) -> dict[str, object]:
        """A JSON-friendly dict (counters flattened in)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__
               if k not in ("counters", "instability_events", "slots")}
        out.update(asdict(self.counters))
        out["num_reused_tokens"] = self.counters.num_reused_tokens
        out["slots"] = [slot.as_dict() for slot in self.slots]
        out["instability_events"] = [
            {**asdict(e), "request_id": repr(e.request_id)} for e in self.instability_events
        ]
        return out


def recent_events(maxlen: int = 32) -> deque[InstabilityEvent]:
    """A bounded buffer for the latest instability events."""
    return deque(maxlen=maxlen)
