"""Turning a strategy's decision into a validated batch.

:class:`Planner` shows the strategy a :class:`~llamapy.engine.strategies.BatchView`, checks the
returned :class:`~llamapy.engine.strategies.BatchDecision` (``n_batch``, ``chunk_size``, known
slots, progress) and lays it out as a :class:`Batch`: one :class:`Entry` per slot, in the same
order as the segments of its :class:`~llamapy.engine.backend.BatchPlan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llamapy.engine.backend import BatchPlan, Segment
from llamapy.engine.slots import Run, Slot
from llamapy.engine.strategies import BatchDecision, BatchStrategy, BatchView, QueuedView, SlotView
from llamapy.errors import InvalidOptionError

__all__ = ["Batch", "Entry", "Planner"]


@dataclass(slots=True)
class Entry:
    """The tokens one slot contributes to a batch."""

    slot: Slot
    run: Run
    token_ids: list[int]
    start_pos: int
    prefill: bool
    samples: bool


@dataclass(slots=True)
class Batch:
    """Entries of one decode call."""

    entries: list[Entry]

    def plan(self) -> BatchPlan:
        """The backend's view of this batch."""
        return BatchPlan([Segment(e.slot.seq_id, e.start_pos, e.token_ids, e.samples, e.run.key)
                          for e in self.entries])

    @property
    def n_tokens(self) -> int:
        """Tokens in the batch."""
        return sum(len(e.token_ids) for e in self.entries)

    def split(self) -> tuple[Batch, Batch]:
        """Two halves (by entries) for retrying under KV pressure."""
        mid = len(self.entries) // 2
        return Batch(self.entries[:mid]), Batch(self.entries[mid:])


def slot_view(slot: Slot) -> SlotView:
    """How a running slot looks to strategies."""
    run = slot.run
    assert run is not None, "slot_view: free slot"
    return SlotView(slot_id=slot.slot_id, request_id=run.request_id,
                    prompt_tokens=len(run.prompt), num_computed=len(slot.cached),
                    remaining_prefill=slot.remaining_prefill, num_generated=run.num_generated,
                    submitted_at=run.submitted_at, admitted_at=run.admitted_at,
                    last_token_at=run.last_token_at, serial=run.serial,
                    leased=slot.lease_id is not None)


def queued_view(run: Run) -> QueuedView:
    """How a queued run looks to strategies."""
    return QueuedView(request_id=run.request_id, prompt_tokens=len(run.prompt),
                      submitted_at=run.submitted_at, serial=run.serial,
                      session=run.request.options.session, lease_id=run.request.lease_id)


class Planner:
    """Asks the strategy for a decision and builds the batch."""

    def __init__(self, strategy: BatchStrategy, n_batch: int, chunk_size: int) -> None:
        self.strategy = strategy
        self.n_batch = n_batch
        self.chunk_size = chunk_size

    def plan(self, decoding: Sequence[Slot], prefilling: Sequence[Slot], queue: Sequence[Run],
             now: float) -> Batch | None:
        """The next batch, or None when no slot can take tokens."""
        if not decoding and not prefilling:
            return None
        view = BatchView(now=now, n_batch=self.n_batch, chunk_size=self.chunk_size,
                         decoding=tuple(slot_view(s) for s in decoding),
                         prefilling=tuple(slot_view(s) for s in prefilling),
                         queue=tuple(queued_view(r) for r in queue))
        decision = self.strategy.allocate(view)
        self.validate(decision, view)
        by_id = {s.slot_id: s for s in (*decoding, *prefilling)}
        entries = [self._decode_entry(by_id[i]) for i in decision.decode]
        entries += [self._prefill_entry(by_id[i], n) for i, n in decision.prefill.items()]
        return Batch(entries)

    def validate(self, decision: BatchDecision, view: BatchView) -> None:
        """Raise ``InvalidOptionError`` if ``decision`` breaks the batch rules."""
        decoding = {s.slot_id for s in view.decoding}
        chunks = {s.slot_id: view.chunk_for(s) for s in view.prefilling}
        problems = []
        if len(set(decision.decode)) != len(decision.decode) or \
                not set(decision.decode) <= decoding:
            problems.append(f"decode {decision.decode} must be distinct decoding slots")
        for slot_id, n in decision.prefill.items():
            if slot_id not in chunks or not isinstance(n, int) or not 1 <= n <= chunks[slot_id]:
                problems.append(f"prefill slot {slot_id}: {n!r} tokens not in "
                                f"[1, {chunks.get(slot_id, 0)}]")
        if decision.n_tokens > view.n_batch:
            problems.append(f"{decision.n_tokens} tokens exceed n_batch={view.n_batch}")
        if decision.n_tokens == 0:
            problems.append("no tokens scheduled although slots are waiting for them")
        if problems:
            name = getattr(self.strategy, "name", type(self.strategy).__name__)
            raise InvalidOptionError(f"batch_strategy {name!r}: " + "; ".join(problems),
                                     option="batch_strategy")

    @staticmethod
    def _decode_entry(slot: Slot) -> Entry:
        run = slot.run
        assert run is not None and len(slot.cached) == len(run.tokens) - 1, "decode entry"
        return Entry(slot, run, [run.tokens[-1]], len(slot.cached), prefill=False, samples=True)

    @staticmethod
    def _prefill_entry(slot: Slot, n: int) -> Entry:
        run = slot.run
        assert run is not None, "prefill entry"
        start = len(slot.cached)
        end = start + n
        samples = end == len(run.prompt) and not run.prefill_only
        return Entry(slot, run, run.prompt[start:end], start, prefill=True, samples=samples)
