"""The fake backend's recurrent state: what a recurrent or hybrid model keeps per sequence.

A hybrid model's sequence is attention KV (one cell per position, trimmable) plus one recurrent
state that has absorbed every token so far and cannot be cut back. The fake models that state
as the position it has reached and the history hash at that position (with the cache key and
adapter set that computed it). A decode continues from the recurrent state, not from the cells:
a state restored from another history, another key or another position is recorded as a
violation, and its outputs differ from the reference, as a real model's would.

- ``seq_rm`` may remove only positions past the recurrent state (all of a sequence, or a tail
  after a checkpoint was restored);
- ``state_seq_get(partial=True)`` serialises the state alone (a context checkpoint:
  ``["FAKERS1", pos, hash, tag, adapters]`` padded to ``nbytes``), and
  ``state_seq_set(partial=True)`` puts one back, leaving the cells as they are.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass

from llamapy.engine.fake.kv import Cell, tag_in, tag_out
from llamapy.engine.fake.model import ROOT_HASH

__all__ = ["RecurrentState", "RecurrentStates"]

_MAGIC = "FAKERS1"


@dataclass(frozen=True, slots=True)
class RecurrentState:
    """The position a sequence's recurrent state has absorbed (-1: none) and its hash."""

    pos: int = -1
    hash: int = ROOT_HASH
    tag: Hashable = None
    adapter_set: Hashable = ()


_EMPTY = RecurrentState()


class RecurrentStates:
    """One :class:`RecurrentState` per sequence, serialised to ``nbytes`` bytes each."""

    def __init__(self, n_seq: int, nbytes: int) -> None:
        self._at = [_EMPTY] * n_seq
        self.nbytes = nbytes

    def of(self, seq: int) -> RecurrentState:
        """The state of ``seq``."""
        return self._at[seq]

    def start(self, seq: int, pos: int, tag: Hashable, adapter_set: Hashable,
              cell_hash: int, violations: list[str]) -> int:
        """The hash a segment of ``seq`` starting at ``pos`` continues from, recording a
        violation when the state is not the one the cells before ``pos`` (hash
        ``cell_hash``) were computed with."""
        state = self._at[seq]
        if pos == 0:
            return ROOT_HASH
        if state.pos != pos - 1 or state.hash != cell_hash:
            violations.append(f"seq {seq}: recurrent state at {state.pos} does not match the "
                              f"KV before position {pos}")
        elif state.tag != tag or state.adapter_set != adapter_set:
            violations.append(f"seq {seq} (tag {tag!r}) continues a recurrent state of "
                              f"{state.tag!r} under adapter set {state.adapter_set!r}")
        return state.hash

    def advance(self, seq: int, cell: Cell) -> None:
        """``seq``'s state has absorbed ``cell``."""
        self._at[seq] = RecurrentState(cell.pos, cell.hash, cell.tag, cell.adapter_set)

    def reset(self, seq: int) -> None:
        """``seq`` is empty."""
        self._at[seq] = _EMPTY

    def can_remove(self, seq: int, p0: int) -> bool:
        """Whether positions from ``p0`` on may go (none the state has absorbed)."""
        return p0 > self._at[seq].pos

    def copy(self, src: int, dst: int, p1: int) -> None:
        """``seq_cp(src, dst, 0, p1)``: ``dst`` shares ``src``'s state if the range holds it."""
        if p1 < 0 or p1 > self._at[src].pos:
            self._at[dst] = self._at[src]

    def encode(self, seq: int) -> bytes:
        """The state of ``seq`` as a checkpoint's bytes."""
        s = self._at[seq]
        body = json.dumps([_MAGIC, s.pos, s.hash, tag_out(s.tag), tag_out(s.adapter_set)])
        raw = body.encode() + b"\n"
        return raw + b"\0" * max(0, self.nbytes - len(raw))

    def size(self, seq: int) -> int:
        """``len(encode(seq))``."""
        return len(self.encode(seq))

    def decode(self, data: bytes) -> RecurrentState | None:
        """The state in ``data`` (from :meth:`encode`), or None when it is not one."""
        try:
            magic, pos, h, tag, adapters = json.loads(data.split(b"\n", 1)[0])
            if magic != _MAGIC or not isinstance(pos, int) or not isinstance(h, int):
                return None
            return RecurrentState(pos, h, tag_in(tag), tag_in(adapters))
        except (ValueError, TypeError):
            return None

    def put(self, seq: int, state: RecurrentState) -> None:
        """Make ``state`` the state of ``seq`` (the cells stay as they are)."""
        self._at[seq] = state
