"""Media for the fake backend: a deterministic stand-in for a model's projector.

:func:`fake_media_chunk` "encodes" any bytes into a :class:`~llamapy.engine.media.MediaChunk`
whose row count depends on the bytes and whose embeddings are a pure function of its digest and
row (:func:`fake_media_rows`), so :class:`~llamapy.engine.fake.backend.FakeBackend` can check
that every media segment it decodes carries the right rows of the right chunk.
"""

from __future__ import annotations

import hashlib
import struct

from llamapy.engine.backend import Segment
from llamapy.engine.media import MediaChunk

__all__ = ["FAKE_MEDIA_WIDTH", "fake_media_chunk", "fake_media_rows", "fake_media_tokens",
           "media_segment_ok"]

#: The embedding width of fake media.
FAKE_MEDIA_WIDTH = 4


def fake_media_rows(digest: bytes, first: int, n: int, width: int = FAKE_MEDIA_WIDTH) -> bytes:
    """Rows ``first .. first + n - 1`` of the embeddings of the chunk with ``digest``."""
    out = bytearray()
    for row in range(first, first + n):
        h = hashlib.blake2b(digest + row.to_bytes(8, "little"), digest_size=2 * width).digest()
        out += struct.pack(f"={width}f", *(h[2 * i] + h[2 * i + 1] / 256.0
                                           for i in range(width)))
    return bytes(out)


def fake_media_tokens(data: bytes) -> int:
    """The rows of the chunk the fake projector makes of ``data``: ``2 + len(data) % 7``."""
    return 2 + len(data) % 7


def fake_media_chunk(data: bytes, kind: str = "image", causal: bool = True) -> MediaChunk:
    """The chunk the fake projector makes of ``data``: :func:`fake_media_tokens` rows
    (``causal``: a projector whose rows may be decoded a few at a time; not: Gemma 3's kind)."""
    projector = b"llamapy-fake-projector\x00" if causal else b"llamapy-fake-bidirectional\x00"
    digest = hashlib.sha256(projector + data).digest()
    n = fake_media_tokens(data)
    return MediaChunk(digest, fake_media_rows(digest, 0, n), n, FAKE_MEDIA_WIDTH, kind, causal)


def media_segment_ok(seg: Segment, violations: list[str]) -> bool:
    """Whether a media segment's ids are its chunk's (else the batch is invalid); appends to
    ``violations`` a segment asking for logits, a part of a chunk that must be decoded whole,
    and rows that are not the chunk's."""
    rows, n = seg.media, len(seg.token_ids)
    assert rows is not None
    chunk = rows.chunk
    ids = chunk.token_ids[rows.first:rows.first + n]
    if tuple(seg.token_ids) != ids or len(ids) != n:
        return False
    if seg.logits:
        violations.append(f"seq {seg.seq_id}: a media segment asks for logits")
    if not chunk.causal and (rows.first, n) != (0, chunk.n_tokens):
        violations.append(f"seq {seg.seq_id}: rows {rows.first}..{rows.first + n} of a chunk "
                          "that must be decoded whole")
    if chunk.width == FAKE_MEDIA_WIDTH and bytes(chunk.rows(rows.first, n)) != \
            fake_media_rows(chunk.digest, rows.first, n):
        violations.append(f"seq {seg.seq_id}: media rows {rows.first}.. are not the chunk's")
    return True
