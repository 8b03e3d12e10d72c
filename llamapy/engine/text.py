"""Incremental detokenisation with stop strings.

Token pieces are bytes that may split a UTF-8 character; :class:`TextStream` releases only
complete characters, holds back text that could be the start of a stop string, and reports a
stop string as soon as it is complete, without ever releasing it.

Matching costs O(number of stop strings) per new character, whatever their length and however
much text came before: each stop string keeps a Knuth-Morris-Pratt automaton whose state is the
longest prefix of the string that ends the text so far. A state equal to the string's length is
a match; the largest state is how much text must be held back. Building the automata costs
O(total length of the stop strings) once per request.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["StopMatcher", "TextStream"]


def _failure(word: str) -> list[int]:
    """KMP failure function: ``out[i]`` is the longest proper border of ``word[:i + 1]``."""
    out, k = [0] * len(word), 0
    for i in range(1, len(word)):
        while k and word[i] != word[k]:
            k = out[k - 1]
        if word[i] == word[k]:
            k += 1
        out[i] = k
    return out


@dataclass(slots=True)
class StopMatcher:
    """Finds stop strings in text fed a few characters at a time (see the module)."""

    words: tuple[str, ...]
    _fail: list[list[int]] = field(init=False)
    _state: list[int] = field(init=False)
    #: Characters fed so far.
    fed: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._fail = [_failure(w) for w in self.words]
        self._state = [0] * len(self.words)

    def feed(self, text: str) -> tuple[int, str] | None:
        """Feed ``text``; return ``(start, word)`` of the match that starts first among those
        completed in it (``start`` counts characters from the first ever fed), else None."""
        best: tuple[int, str] | None = None
        for index, (word, fail) in enumerate(zip(self.words, self._fail, strict=True)):
            k, pos = self._state[index], self.fed
            for ch in text:
                while k and (k == len(word) or ch != word[k]):
                    k = fail[k - 1]
                if ch == word[k]:
                    k += 1
                pos += 1
                if k == len(word):
                    start = pos - k
                    if best is None or start < best[0]:
                        best = (start, word)
                    break  # this word's first match in the text is all that counts
            self._state[index] = k
        self.fed += len(text)
        return best

    @property
    def held(self) -> int:
        """How many trailing characters may still begin a stop string."""
        return max(self._state, default=0)


@dataclass(slots=True)
class TextStream:
    """Bytes in, releasable text out."""

    stop: Sequence[str] = ()
    _decoder: codecs.IncrementalDecoder | None = field(init=False, default=None)
    _pending: str = field(init=False, default="")
    _matcher: StopMatcher | None = field(init=False, default=None)
    #: The stop string that matched ("" until one does).
    stop_word: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        if self.stop:
            self._matcher = StopMatcher(tuple(self.stop))

    def push(self, piece: bytes) -> tuple[str, bool]:
        """Add a token's bytes; return ``(text now safe to release, stop string matched)``.

        After a match the stream is finished: the text before the stop string is returned and
        everything from the stop string on is dropped.
        """
        assert self._decoder is not None
        text = self._decoder.decode(piece)
        matcher = self._matcher
        if matcher is None:
            return self._pending + text, False
        start_of_pending = matcher.fed - len(self._pending)
        self._pending += text
        hit = matcher.feed(text)
        if hit is not None:
            at, word = hit
            released = self._pending[:at - start_of_pending]
            self._pending, self.stop_word = "", word
            return released, True
        cut = len(self._pending) - min(matcher.held, len(self._pending))
        released, self._pending = self._pending[:cut], self._pending[cut:]
        return released, False

    def flush(self) -> str:
        """End of generation: release everything still held (an incomplete UTF-8 tail becomes
        U+FFFD; a partial stop-string prefix is released, it never completed)."""
        assert self._decoder is not None
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return text
