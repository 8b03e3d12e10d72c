"""Rewinding sequences that cannot be trimmed: taking, restoring and shipping checkpoints.

:class:`Rewinder` is the resolver's part that deals with
:mod:`~llamapy.engine.cache.checkpoints` on a backend without partial removal (recurrent,
hybrid, a sliding window kept whole only in its window):

- :meth:`Rewinder.plan` names the positions a run's prefill stops at to take a checkpoint, and
  :meth:`Rewinder.take` takes them after the chunk that ends there;
- :meth:`Rewinder.reach` tells how much of a prompt a sequence can keep (its whole length when
  the prompt extends it, else the newest checkpoint at or before the divergence), and
  :meth:`Rewinder.rewind` restores that checkpoint so the tail can be removed;
- :meth:`Rewinder.copy` gives a slot another slot's sequence with its checkpoints (a donor:
  the state is copied whole, since a recurrent state cannot be shared cell by cell), which the
  resolver then rewinds to the shared prefix;
- :meth:`Rewinder.blob` hands a slot's prefix to the cache tiers with its checkpoints packed
  in (:func:`~llamapy.engine.cache.checkpoints.pack`), so a prefix restored from RAM or disk,
  after a restart too, can still be rewound.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llamapy.engine.backend import Backend
from llamapy.engine.cache.checkpoints import (
    Checkpoint,
    Checkpoints,
    checkpoint_positions,
    digest,
    pack,
    packed_size,
    unpack,
)
from llamapy.engine.request import Run
from llamapy.engine.slots import Slot
from llamapy.engine.stats import Counters

__all__ = ["Rewinder"]

class Rewinder:
    """Checkpoints for the resolver (see the module docstring). ``active`` is False on a
    backend that can trim (it needs none) or with ``max_count`` 0 (checkpoints off)."""

    def __init__(self, backend: Backend, counters: Counters, *, max_count: int,
                 max_bytes: int, step: int) -> None:
        self.backend = backend
        self.counters = counters
        self.active = not backend.supports_partial_removal and max_count > 0
        self.max_count, self.max_bytes, self.step = max_count, max_bytes, step

    def plan(self, run: Run, start: int) -> None:
        """The positions ``run``'s prefill from ``start`` stops at to take checkpoints."""
        if self.active and run.cache_prompt and not run.whole_prefill:
            run.checkpoints_at = checkpoint_positions(start, len(run.prompt), self.step,
                                                      run.request.checkpoint_hints)

    def take(self, run: Run, slot: Slot) -> None:
        """After a prefill chunk: checkpoint ``slot`` if it now ends at one of ``run``'s
        positions (positions left behind are dropped)."""
        held = len(slot.cached)
        while run.checkpoints_at and run.checkpoints_at[0] <= held:
            if run.checkpoints_at.pop(0) == held:
                state = self.backend.state_seq_get(slot.seq_id, partial=True)
                slot.checkpoints.add(Checkpoint(held, digest(slot.cached), state),
                                     self.max_count, self.max_bytes)
                self.counters.num_checkpoints_taken += 1

    def reach(self, cached: Sequence[int], checkpoints: Checkpoints, n: int) -> int:
        """How many of ``n`` shared tokens a sequence holding ``cached`` can keep: all when
        ``n`` covers it, else the newest usable checkpoint at or before ``n`` (0 if none)."""
        if n >= len(cached) or not self.active:
            return n if n >= len(cached) else 0
        best = checkpoints.best(n, cached)
        return best.n_tokens if best is not None else 0

    @staticmethod
    def reach_entry(held: Sequence[int] | None, size: int, n: int) -> int:
        """:meth:`reach` for a tier entry of ``size`` tokens with checkpoints at ``held``
        (None: not known before it is read, so ``n`` is hoped for; the restore still floors
        it)."""
        if n >= size or held is None:
            return n
        return max((p for p in held if p <= n), default=0)

    def rewind(self, slot: Slot, keep: int) -> int:
        """Restore ``slot``'s newest usable checkpoint at or before ``keep`` (the tail after
        it may then be removed); the position restored, 0 when none could be."""
        best = slot.checkpoints.best(keep, slot.cached) if self.active else None
        if best is None:
            return 0
        if not self.backend.state_seq_set(slot.seq_id, best.state, partial=True):
            slot.cached.clear()  # (the backend emptied the sequence)
            slot.checkpoints.clear()
            return 0
        self.counters.num_checkpoint_restores += 1
        return best.n_tokens

    def copy(self, donor: Slot, slot: Slot) -> bool:
        """Give empty ``slot`` ``donor``'s whole sequence and checkpoints (False, ``slot``
        left empty, when the backend refuses the state)."""
        state = self.backend.state_seq_get(donor.seq_id)
        if not state or not self.backend.state_seq_set(slot.seq_id, state):
            self.backend.seq_rm(slot.seq_id, 0, -1)
            return False
        slot.cached = list(donor.cached)
        slot.checkpoints = Checkpoints(donor.checkpoints.items)
        return True

    def blob(self, slot: Slot) -> tuple[Callable[[], int], Callable[[], bytes]]:
        """``(get_size, get_data)`` of ``slot``'s prefix for a cache tier: its state, packed
        with its checkpoints when they are kept."""
        seq, backend = slot.seq_id, self.backend
        if not self.active:
            return lambda: backend.state_seq_size(seq), lambda: backend.state_seq_get(seq)
        held = slot.checkpoints.items
        return (lambda: packed_size(backend.state_seq_size(seq), held),
                lambda: pack(backend.state_seq_get(seq), held))

    def unpack(self, blob: bytes, token_ids: Sequence[int]) -> tuple[bytes, Checkpoints]:
        """:func:`unpack` when checkpoints are kept, else the blob as a bare state."""
        return unpack(blob, token_ids) if self.active else (blob, Checkpoints())
