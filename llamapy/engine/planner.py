"""Turning a strategy's decision into a validated batch.

:class:`Planner` shows the strategy a :class:`~llamapy.engine.strategies.BatchView`, checks the
returned :class:`~llamapy.engine.strategies.BatchDecision` (``n_batch``, ``chunk_size``, known
slots, progress) and lays it out as a :class:`ScheduledBatch` (this tick's work): one
:class:`Entry` per slot, in the same order as the segments of the
:class:`~llamapy.engine.backend.BatchPlan` it becomes (``to_plan``).

One decode runs under one adapter set (llama.cpp applies LoRA per context), so the planner first
picks the set this tick serves (:class:`AdapterRotation`) and shows the strategy only the slots
of that set; the other sets' slots wait for a later tick.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from llamapy.engine.backend import BatchPlan, Segment
from llamapy.engine.media import MediaRows
from llamapy.engine.request import Run
from llamapy.engine.slots import Slot
from llamapy.engine.strategies import (
    BatchDecision,
    BatchStrategy,
    BatchView,
    QueuedView,
    SlotView,
    decodes_every_slot,
)
from llamapy.errors import InvalidOptionError

__all__ = ["AdapterRotation", "Entry", "Planner", "ScheduledBatch"]


@dataclass(slots=True)
class Entry:
    """The tokens one slot contributes to a batch."""

    slot: Slot
    run: Run
    token_ids: list[int]
    start_pos: int
    prefill: bool
    samples: bool
    draft: list[int] = field(default_factory=list)
    draft_tag: Hashable = None
    draft_bucket: Hashable = None
    media: MediaRows | None = None


@dataclass(slots=True)
class ScheduledBatch:
    """Entries of one decode call, all of runs of ``adapter_set``."""

    entries: list[Entry]
    adapter_set: Hashable = ()
    #: The backend's view, built ahead (:mod:`llamapy.engine.steady`); None: built when
    #: decoded.
    plan: BatchPlan | None = None

    def to_plan(self) -> BatchPlan:
        """The backend's view of this batch."""
        return BatchPlan([_segment(e) for e in self.entries], self.adapter_set)

    @property
    def n_tokens(self) -> int:
        """Tokens in the batch."""
        return sum(len(e.token_ids) for e in self.entries)

    def split(self) -> tuple[ScheduledBatch, ScheduledBatch]:
        """Two halves (by entries) for retrying under KV pressure."""
        mid = len(self.entries) // 2
        return (ScheduledBatch(self.entries[:mid], self.adapter_set),
                ScheduledBatch(self.entries[mid:], self.adapter_set))


def _segment(entry: Entry) -> Segment:
    """An entry as the backend sees it: a pooled run's every row is an output."""
    pooled = entry.run.whole_prefill
    outputs = len(entry.token_ids) if pooled else len(entry.draft) + 1
    return Segment(entry.slot.seq_id, entry.start_pos, entry.token_ids, entry.samples or pooled,
                   entry.run.key, outputs, entry.draft_tag, entry.media)


def slot_view(slot: Slot) -> SlotView:
    """How a running slot looks to strategies."""
    run = slot.run
    assert run is not None, "slot_view: free slot"
    return SlotView(slot_id=slot.slot_id, request_id=run.request_id,
                    prompt_tokens=len(run.prompt), num_computed=len(slot.cached),
                    remaining_prefill=slot.remaining_prefill, num_generated=run.num_generated,
                    submitted_at=run.submitted_at, admitted_at=run.admitted_at,
                    last_token_at=run.last_token_at, serial=run.serial,
                    leased=slot.lease_id is not None, whole=run.whole_prefill)


def queued_view(run: Run, cached_tokens: int = 0) -> QueuedView:
    """How a queued run looks to strategies."""
    return QueuedView(request_id=run.request_id, prompt_tokens=len(run.prompt),
                      submitted_at=run.submitted_at, serial=run.serial,
                      session=run.request.options.session, lease_id=run.request.lease_id,
                      cached_tokens=cached_tokens)


class AdapterRotation:
    """Which adapter set a tick serves.

    Policy: the set served least recently goes first (a set not served yet counts as the
    oldest); ties go to the set holding the oldest run (submission order). With ``k`` sets that
    have work, each is served at least once every ``k`` ticks: no set starves, and a decoding
    stream waits at most ``k - 1`` ticks for its next token (one tick with two sets). With a
    single set (the usual case) every tick serves it, as before. Sets without work are forgotten.
    """

    def __init__(self) -> None:
        self._tick = 0
        self._served: dict[Hashable, int] = {}
        #: How many sets had work at the last :meth:`choose`.
        self.n_sets = 0

    def choose(self, slots: Sequence[Slot]) -> Hashable:
        """The set to serve this tick among the runs on ``slots`` (at least one)."""
        oldest: dict[Hashable, int] = {}
        for slot in slots:
            run = slot.run
            assert run is not None, "choose: free slot"
            oldest[run.adapter_set] = min(oldest.get(run.adapter_set, run.serial), run.serial)
        self.n_sets = len(oldest)
        chosen = min(oldest, key=lambda s: (self._served.get(s, 0), oldest[s]))
        self._tick += 1
        self._served = {s: self._served.get(s, 0) for s in oldest}
        self._served[chosen] = self._tick
        return chosen


class Planner:
    """Asks the strategy for a decision and builds the batch."""

    def __init__(self, strategy: BatchStrategy, n_batch: int, chunk_size: int,
                 pass_tokens: Callable[[], float] = lambda: 0.0) -> None:
        self.strategy = strategy
        self.n_batch = n_batch
        self.chunk_size = chunk_size
        #: What the strategies see as :attr:`BatchView.pass_tokens` (the learned decode cost).
        self.pass_tokens = pass_tokens
        self.rotation = AdapterRotation()
        self._plain = decodes_every_slot(strategy)

    @property
    def plain(self) -> bool:
        """Whether the strategy decodes every decoding slot each tick and one adapter set
        serves them all (so a steady decode may chain: :mod:`llamapy.engine.steady`)."""
        return self._plain and self.rotation.n_sets <= 1

    def schedule(self, decoding: Sequence[Slot], prefilling: Sequence[Slot], queue: Sequence[Run],
                 now: float) -> ScheduledBatch | None:
        """The next batch (runs of one adapter set), or None when no slot can take tokens."""
        if not decoding and not prefilling:
            return None
        adapter_set = self.rotation.choose([*decoding, *prefilling])
        if self.rotation.n_sets > 1:
            decoding = [s for s in decoding if _adapter_set(s) == adapter_set]
            prefilling = [s for s in prefilling if _adapter_set(s) == adapter_set]
        if self._plain and not prefilling:
            return self._decode_only(decoding, adapter_set)
        view = BatchView(now=now, n_batch=self.n_batch, chunk_size=self.chunk_size,
                         decoding=tuple(slot_view(s) for s in decoding),
                         prefilling=tuple(slot_view(s) for s in prefilling),
                         queue=tuple(queued_view(r) for r in queue),
                         pass_tokens=self.pass_tokens())
        decision = self.strategy.allocate(view)
        self.validate(decision, view)
        by_id = {s.slot_id: s for s in (*decoding, *prefilling)}
        entries = [self._decode_entry(by_id[i]) for i in decision.decode]
        entries += [self._prefill_entry(by_id[i], n) for i, n in decision.prefill.items()]
        return ScheduledBatch(entries, adapter_set)

    def _decode_only(self, decoding: Sequence[Slot], adapter_set: Hashable) -> ScheduledBatch:
        """What a built-in strategy decides when no slot prefills (every decoding slot, the
        longest waiting first, up to ``n_batch``), without building its view: the steady
        decode tick, where the Python around each token is what a stream waits for."""
        order = sorted(decoding, key=_wait_key)[: self.n_batch]
        return ScheduledBatch([self._decode_entry(s) for s in order], adapter_set)

    def validate(self, decision: BatchDecision, view: BatchView) -> None:
        """Raise ``InvalidOptionError`` if ``decision`` breaks the batch rules."""
        decoding = {s.slot_id for s in view.decoding}
        chunks = {s.slot_id: view.chunk_for(s) for s in view.prefilling}
        problems = []
        if len(set(decision.decode)) != len(decision.decode) or \
                not set(decision.decode) <= decoding:
            problems.append(f"decode {decision.decode} must be distinct decoding slots")
        whole = {s.slot_id for s in view.prefilling if s.whole}
        for slot_id, n in decision.prefill.items():
            if slot_id not in chunks or not isinstance(n, int) or not 1 <= n <= chunks[slot_id]:
                problems.append(f"prefill slot {slot_id}: {n!r} tokens not in "
                                f"[1, {chunks.get(slot_id, 0)}]")
            elif slot_id in whole and n != chunks[slot_id]:
                problems.append(f"prefill slot {slot_id}: {n} tokens of a prefill that is "
                                f"decoded whole ({chunks[slot_id]})")
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
        end, media = run.media_cut(start, start + run.chunk_to_pin(start, n))
        samples = end == len(run.prompt) and not run.prefill_only
        return Entry(slot, run, run.prompt[start:end], start, prefill=True, samples=samples,
                     media=media)


def _wait_key(slot: Slot) -> tuple[float, int]:
    """The order of :meth:`BaseStrategy.decoders_by_wait` on a slot."""
    run = slot.run
    assert run is not None, "wait key of a free slot"
    return run.last_token_at or 0.0, run.serial


def _adapter_set(slot: Slot) -> Hashable:
    assert slot.run is not None, "adapter set of a free slot"
    return slot.run.adapter_set
