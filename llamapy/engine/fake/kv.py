"""The fake backend's KV cell and the serialised form of a sequence's cells.

A serialised sequence is one JSON line ``["FAKEKV1", rows]`` (a row per cell: position, token,
history hash, tag, adapter set; tuples written as lists) followed by a newline and zero padding
up to ``bytes_per_token`` per cell, so state sizes scale with tokens as real state does.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

__all__ = ["Cell", "decode_cells", "encode_cells", "encoded_size", "tag_in", "tag_out"]

_MAGIC = "FAKEKV1"


@dataclass(slots=True)
class Cell:
    """One simulated KV cell: computed for ``token`` at ``pos`` under ``adapter_set`` by a
    request whose cache key is ``tag``; ``hash`` covers the whole history up to it."""

    pos: int
    token: int
    hash: int
    tag: Hashable
    adapter_set: Hashable = ()
    seqs: set[int] = field(default_factory=set)

    @property
    def mark(self) -> tuple[Hashable, Hashable]:
        """``(tag, adapter_set)``: what a reader of the cell must match."""
        return (self.tag, self.adapter_set)


def encode_cells(cells: Sequence[Cell], bytes_per_token: int) -> bytes:
    """Serialise ``cells`` (in position order), padded to ``bytes_per_token`` per cell."""
    body = _body(cells)
    return body + b"\n" + b"\0" * _padding(len(body), len(cells), bytes_per_token)


def encoded_size(cells: Sequence[Cell], bytes_per_token: int) -> int:
    """``len(encode_cells(cells, bytes_per_token))`` without building the padded blob (like
    ``llama_state_seq_get_size``, it walks the cells but copies no state)."""
    n = len(_body(cells))
    return n + 1 + _padding(n, len(cells), bytes_per_token)


def _body(cells: Sequence[Cell]) -> bytes:
    rows = [[c.pos, c.token, c.hash, tag_out(c.tag), tag_out(c.adapter_set)] for c in cells]
    return json.dumps([_MAGIC, rows]).encode()


def _padding(body_len: int, n_cells: int, bytes_per_token: int) -> int:
    return max(0, bytes_per_token * n_cells - body_len - 1)


def decode_cells(data: bytes) -> list[Cell] | None:
    """The cells of ``data`` from :func:`encode_cells` (not linked to any sequence), or None
    when ``data`` is not in that format."""
    try:
        magic, rows = json.loads(data.split(b"\n", 1)[0])
        if magic != _MAGIC:
            return None
        return [Cell(pos, token, h, tag_in(tag), tag_in(adapters))
                for pos, token, h, tag, adapters in rows]
    except (ValueError, TypeError):
        return None


def tag_out(value: Hashable) -> object:
    """A tag or adapter set as JSON (tuples become lists, recursively)."""
    return [tag_out(v) for v in value] if isinstance(value, tuple) else value


def tag_in(value: object) -> Hashable:
    """Inverse of :func:`tag_out`."""
    return tuple(tag_in(v) for v in value) if isinstance(value, list) else value
