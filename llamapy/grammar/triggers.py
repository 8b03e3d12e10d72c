"""Watching generated tokens for a lazy grammar's trigger, over a bounded tail.

:class:`TriggerWatch` is fed each generated token with its bytes. It keeps the last
:data:`TAIL_BYTES` bytes of the output (whole tokens) and matches the compiled trigger patterns
(:class:`llamapy.options.triggers.TriggerSet`, linear-time) against them. When one matches it
answers a :class:`TriggerHit`: the tokens that overlap the text from the grammar's start on,
and the bytes of the first of them that lie before that start. A grammar fed those tokens after
a literal of those bytes (:func:`prefixed_grammar`) is in the state llama.cpp's lazy grammar
reaches when it replays the matched text.

A pattern sees at most the tail: a match must fit in the last :data:`TAIL_BYTES` bytes, and once
the output is longer than that, ``^`` no longer matches (the tail does not start the output).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from llamapy.options.triggers import TriggerSet

__all__ = ["TAIL_BYTES", "TriggerHit", "TriggerWatch", "gbnf_literal", "prefixed_grammar"]

#: Bytes of output a trigger pattern is matched against (the newest ones).
TAIL_BYTES = 4096


@dataclass(frozen=True, slots=True)
class TriggerHit:
    """Where a lazy grammar starts: replay ``tokens`` into a grammar that first reads
    ``prefix`` (the bytes of ``tokens[0]`` before the start)."""

    tokens: tuple[int, ...]
    prefix: bytes


class TriggerWatch:
    """The output's tail, matched against trigger patterns as tokens arrive."""

    __slots__ = ("_base", "_before", "_buffer", "_spans", "_tail", "_triggers")

    def __init__(self, triggers: TriggerSet, tail_bytes: int = TAIL_BYTES) -> None:
        self._triggers = triggers
        self._tail = tail_bytes
        self._buffer = bytearray()
        self._spans: deque[tuple[int, int]] = deque()  # (token, its length), oldest first
        self._base = 0  # offset in the output of _buffer[0]
        self._before = b""  # the output's byte just before _buffer (empty at its start)

    @property
    def num_bytes(self) -> int:
        """Bytes held (at most the tail and one token)."""
        return len(self._buffer)

    def clear(self) -> None:
        """Drop what was watched: patterns see only later tokens (``^`` no longer matches)."""
        if self._buffer:
            self._before = bytes(self._buffer[-1:])
        self._base += len(self._buffer)
        self._buffer.clear()
        self._spans.clear()

    def feed(self, token: int, piece: bytes) -> TriggerHit | None:
        """Add one generated token; a hit when a pattern now matches the tail."""
        self._buffer += piece
        self._spans.append((token, len(piece)))
        self._trim()
        text, pos = (bytes(self._buffer), 0) if not self._before else (
            self._before + self._buffer, 1)
        start = self._triggers.find(text, pos)
        return None if start is None else self._hit(start - pos)

    def _trim(self) -> None:
        """Drop whole tokens from the front while the rest still holds the tail."""
        while len(self._spans) > 1 and len(self._buffer) - self._spans[0][1] >= self._tail:
            _, size = self._spans.popleft()
            if size:
                self._before = bytes(self._buffer[size - 1:size])
            del self._buffer[:size]
            self._base += size

    def _hit(self, start: int) -> TriggerHit:
        """The replay for a grammar starting at ``start`` (an offset in the buffer)."""
        begins, offset = [], 0
        for token, size in self._spans:
            begins.append((offset, token))
            offset += size
        first = max(i for i, (at, _) in enumerate(begins) if at <= start)
        for i in range(first, -1, -1):  # a prefix that is whole UTF-8 characters
            prefix = bytes(self._buffer[begins[i][0]:start])
            if _is_utf8(prefix):
                return TriggerHit(tuple(t for _, t in begins[i:]), prefix)
        later = [t for at, t in begins if at >= start]  # no clean prefix: from the next token
        return TriggerHit(tuple(later), b"")


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def gbnf_literal(data: bytes) -> str:
    """``data`` (UTF-8) as a GBNF string literal, quotes included."""
    out = ['"']
    for char in data.decode("utf-8"):
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02X}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def prefixed_grammar(grammar: str, root: str, prefix: bytes) -> tuple[str, str]:
    """``grammar`` with a start rule that reads ``prefix`` and then ``root``: the text and the
    new start rule's name (``grammar`` and ``root`` unchanged for an empty prefix)."""
    if not prefix:
        return grammar, root
    name = "llamapy-trigger-prefix"
    while name in grammar:
        name += "-x"
    return f"{grammar}\n{name} ::= {gbnf_literal(prefix)} {root}\n", name
