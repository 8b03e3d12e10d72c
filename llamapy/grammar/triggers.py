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
Matching is linear in the tail, but a pattern RE2 cannot keep in its DFA runs in its NFA, whose
constant grows with the pattern: the watch counts the thread time it spends, and past
:data:`MAX_MATCH_S` a token on average it raises
:class:`~llamapy.errors.TriggerTooCostlyError` (the request ends; the others go on).
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from dataclasses import dataclass

from llamapy.errors import TriggerTooCostlyError
from llamapy.options.triggers import TriggerSet

__all__ = ["MAX_MATCH_S", "TAIL_BYTES", "TriggerHit", "TriggerWatch", "gbnf_literal",
           "prefixed_grammar"]

#: Bytes of output a trigger pattern is matched against (the newest ones).
TAIL_BYTES = 4096
#: Most thread time matching may take a token, on average (common patterns take microseconds).
MAX_MATCH_S = 0.001
#: Thread time spent before the average is judged (a slow first token is not enough).
_GRACE_S = 0.02


@dataclass(frozen=True, slots=True)
class TriggerHit:
    """Where a lazy grammar starts: replay ``tokens`` into a grammar that first reads
    ``prefix`` (the bytes of ``tokens[0]`` before the start)."""

    tokens: tuple[int, ...]
    prefix: bytes


class TriggerWatch:
    """The output's tail, matched against trigger patterns as tokens arrive."""

    __slots__ = ("_base", "_before", "_buffer", "_fed", "_spans", "_spent", "_tail",
                 "_triggers")

    def __init__(self, triggers: TriggerSet, tail_bytes: int = TAIL_BYTES) -> None:
        self._triggers = triggers
        self._tail = tail_bytes
        self._buffer = bytearray()
        self._spans: deque[tuple[int, int]] = deque()  # (token, its length), oldest first
        self._base = 0  # offset in the output of _buffer[0]
        self._before = b""  # the output's byte just before _buffer (empty at its start)
        self._fed = 0  # tokens fed
        self._spent = 0.0  # thread time spent matching (s)

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
        started = time.thread_time()
        start = self._triggers.find(text, pos)
        self._account(time.thread_time() - started)
        return None if start is None else self._hit(start - pos)

    def _account(self, spent: float) -> None:
        """Count one token's matching time; raise when the patterns cost too much."""
        self._fed += 1
        self._spent += spent
        if self._spent > _GRACE_S and self._spent > self._fed * MAX_MATCH_S:
            raise TriggerTooCostlyError(MAX_MATCH_S)

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
    name = f"llamapy-trigger-{secrets.token_hex(8)}"  # no rule of the grammar has it
    return f"{grammar}\n{name} ::= {gbnf_literal(prefix)} {root}\n", name
