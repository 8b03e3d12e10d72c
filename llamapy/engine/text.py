"""Incremental detokenisation with stop strings.

Token pieces are bytes that may split a UTF-8 character; :class:`TextStream` releases only
complete characters, holds back text that could be the start of a stop string, and reports a
stop string as soon as it is complete, without ever releasing it.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["TextStream"]


@dataclass(slots=True)
class TextStream:
    """Bytes in, releasable text out."""

    stop: Sequence[str] = ()
    _decoder: codecs.IncrementalDecoder | None = field(init=False, default=None)
    _pending: str = field(init=False, default="")
    #: The stop string that matched ("" until one does).
    stop_word: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: bytes) -> tuple[str, bool]:
        """Add a token's bytes; return ``(text now safe to release, stop string matched)``.

        After a match the stream is finished: the text before the stop string is returned and
        everything from the stop string on is dropped.
        """
        assert self._decoder is not None
        self._pending += self._decoder.decode(piece)
        return self._release()

    def flush(self) -> str:
        """End of generation: release everything still held (an incomplete UTF-8 tail becomes
        U+FFFD; a partial stop-string prefix is released, it never completed)."""
        assert self._decoder is not None
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return text

    def _release(self) -> tuple[str, bool]:
        if not self.stop:
            text, self._pending = self._pending, ""
            return text, False
        hit = self._first_stop()
        if hit is not None:
            at, word = hit
            text, self._pending, self.stop_word = self._pending[:at], "", word
            return text, True
        keep = self._held_suffix()
        cut = len(self._pending) - keep
        text, self._pending = self._pending[:cut], self._pending[cut:]
        return text, False

    def _first_stop(self) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for word in self.stop:
            at = self._pending.find(word)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, word)
        return best

    def _held_suffix(self) -> int:
        """Length of the longest suffix of pending text that starts some stop string."""
        pending, keep = self._pending, 0
        for word in self.stop:
            for n in range(min(len(word) - 1, len(pending)), keep, -1):
                if pending.endswith(word[:n]):
                    keep = n
                    break
        return keep
