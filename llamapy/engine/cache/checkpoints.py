"""Context checkpoints: restore points inside a sequence whose state cannot be trimmed.

A recurrent or hybrid model (and a sliding-window cache that keeps only its window) cannot cut
a sequence back to an arbitrary position: its recurrent state has absorbed every token. A
checkpoint is that state as it stood after the first ``n_tokens`` of the sequence
(``Backend.state_seq_get(seq, partial=True)``: the recurrent or window state alone, not the
whole KV). To reuse a prefix that ends inside the sequence, the engine restores the newest
checkpoint at or before the point where the new prompt diverges
(``state_seq_set(seq, state, partial=True)``), removes the positions after it (which then
succeeds) and prefills the rest.

Where checkpoints are taken (:func:`checkpoint_positions`): every ``step`` prompt tokens of a
prefill, at the end of the prompt, and at positions the request names (where its rendering is
known to change on the next turn: the start of the generation prompt). The planner ends prefill
chunks there, so after the chunk the state is exactly the checkpoint's.

Each checkpoint carries a digest of the tokens it covers; it is used only when the sequence
still holds those tokens (a slot's cached tokens are rewritten in many places, and a checkpoint
of another history must never be restored). A slot's checkpoints are bounded in count and in
bytes; over either bound the one whose loss costs least goes (the one closest after its
predecessor), never the newest. They travel with the slot's prefix to the RAM and disk tiers,
packed with its state in one blob (:func:`pack`, :func:`unpack`; the tiers store it as they
store a state).

A restored prefix, after a restart too, can then still be rewound.

Blob layout (little-endian): ``b"LPYCKPT1"``, u32 count, u64 state length, then per checkpoint
u64 position and u64 length, then the state, then each checkpoint's bytes. A blob without the
magic is a bare state with no checkpoints.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["Checkpoint", "Checkpoints", "checkpoint_positions", "digest", "pack", "packed_size",
           "positions", "read_positions", "unpack"]


def digest(token_ids: Sequence[int]) -> int:
    """A digest of ``token_ids`` (deterministic across processes: a tuple of ints)."""
    return hash(tuple(token_ids))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The untrimmable state after the first ``n_tokens`` tokens, whose digest is ``digest``."""

    n_tokens: int
    digest: int
    state: bytes

    @property
    def nbytes(self) -> int:
        """Bytes of state."""
        return len(self.state)


class Checkpoints:
    """A sequence's checkpoints by position (see the module docstring)."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[Checkpoint] = ()) -> None:
        self._items = sorted(items, key=lambda c: c.n_tokens)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Checkpoint]:
        return iter(self._items)

    @property
    def items(self) -> tuple[Checkpoint, ...]:
        """The checkpoints, oldest position first."""
        return tuple(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes of state held."""
        return sum(c.nbytes for c in self._items)

    @property
    def positions(self) -> list[int]:
        """The positions held."""
        return [c.n_tokens for c in self._items]

    def add(self, checkpoint: Checkpoint, max_count: int, max_bytes: int) -> None:
        """Keep ``checkpoint`` (replacing one at its position), then drop the cheapest to
        lose while over ``max_count`` or ``max_bytes`` (the newest stays)."""
        self._items = [c for c in self._items if c.n_tokens != checkpoint.n_tokens]
        self._items.append(checkpoint)
        self._items.sort(key=lambda c: c.n_tokens)
        while len(self._items) > 1 and (len(self._items) > max_count
                                        or self.nbytes > max_bytes):
            self._items.pop(self._cheapest())
        if self._items and (max_count < 1 or self.nbytes > max_bytes):
            self._items.clear()

    def _cheapest(self) -> int:
        """The index whose loss widens a gap least (the newest never)."""
        gaps = [c.n_tokens - (self._items[i - 1].n_tokens if i else 0)
                for i, c in enumerate(self._items[:-1])]
        return gaps.index(min(gaps))

    def best(self, n: int, token_ids: Sequence[int]) -> Checkpoint | None:
        """The newest checkpoint at or before ``n`` whose tokens are ``token_ids``' first
        ones, or None."""
        for c in reversed(self._items):
            if 0 < c.n_tokens <= min(n, len(token_ids)) \
                    and c.digest == digest(token_ids[:c.n_tokens]):
                return c
        return None

    def drop_after(self, n: int) -> None:
        """Forget checkpoints past position ``n`` (the sequence no longer holds them)."""
        self._items = [c for c in self._items if c.n_tokens <= n]

    def clear(self) -> None:
        """Forget them all."""
        self._items.clear()


def checkpoint_positions(start: int, end: int, step: int, hints: Iterable[int] = ()) -> list[int]:
    """Positions in ``(start, end]`` to checkpoint a prefill from ``start`` to ``end`` at:
    each multiple of ``step`` (none with ``step`` 0), ``end``, and the ``hints`` in range."""
    points = {end, *(h for h in hints if start < h <= end)}
    if step > 0:
        points.update(range((start // step + 1) * step, end, step))
    return sorted(p for p in points if p > start)


_MAGIC = b"LPYCKPT1"
_HEAD = struct.Struct("<IQ")
_ITEM = struct.Struct("<QQ")


def pack(state: bytes, checkpoints: Sequence[Checkpoint]) -> bytes:
    """``state`` and ``checkpoints`` as one blob (see the module docstring)."""
    head = _MAGIC + _HEAD.pack(len(checkpoints), len(state))
    items = b"".join(_ITEM.pack(c.n_tokens, c.nbytes) for c in checkpoints)
    return b"".join([head, items, state, *(c.state for c in checkpoints)])


def packed_size(state_size: int, checkpoints: Sequence[Checkpoint]) -> int:
    """``len(pack(state, checkpoints))`` for a state of ``state_size`` bytes."""
    return (len(_MAGIC) + _HEAD.size + _ITEM.size * len(checkpoints) + state_size
            + sum(c.nbytes for c in checkpoints))


def unpack(blob: bytes, token_ids: Sequence[int]) -> tuple[bytes, Checkpoints]:
    """The state and the checkpoints (digested against ``token_ids``, the tokens the state
    holds) in ``blob``; a blob that is not a well-formed pack is a bare state."""
    if not blob.startswith(_MAGIC):
        return blob, Checkpoints()
    try:
        count, state_len = _HEAD.unpack_from(blob, len(_MAGIC))
        at = len(_MAGIC) + _HEAD.size
        items = [_ITEM.unpack_from(blob, at + i * _ITEM.size) for i in range(count)]
        at += count * _ITEM.size
        state, at = blob[at:at + state_len], at + state_len
        found = []
        for n, size in items:
            if not 0 < n <= len(token_ids) or at + size > len(blob):
                return blob, Checkpoints()
            found.append(Checkpoint(n, digest(token_ids[:n]), blob[at:at + size]))
            at += size
    except struct.error:
        return blob, Checkpoints()
    return (state, Checkpoints(found)) if len(state) == state_len else (blob, Checkpoints())


def positions(blob: bytes) -> list[int]:
    """The checkpoint positions in ``blob`` (its header alone is read; none for a bare
    state)."""
    if not blob.startswith(_MAGIC):
        return []
    try:
        count, _ = _HEAD.unpack_from(blob, len(_MAGIC))
        at = len(_MAGIC) + _HEAD.size
        return [_ITEM.unpack_from(blob, at + i * _ITEM.size)[0] for i in range(count)]
    except struct.error:
        return []


#: Most checkpoint positions :func:`read_positions` reads from one file.
MAX_READ_POSITIONS = 4096


def read_positions(f: BinaryIO) -> list[int]:
    """The checkpoint positions of the blob that starts at ``f``'s position (its header alone
    is read; none for a bare state or a header past :data:`MAX_READ_POSITIONS`)."""
    head = f.read(len(_MAGIC) + _HEAD.size)
    if len(head) < len(_MAGIC) + _HEAD.size or not head.startswith(_MAGIC):
        return []
    count, _ = _HEAD.unpack_from(head, len(_MAGIC))
    if count > MAX_READ_POSITIONS:
        return []
    return positions(head + f.read(count * _ITEM.size))
