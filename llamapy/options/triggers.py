"""Trigger patterns of a lazy grammar, compiled for a linear-time matcher.

A lazy grammar (``grammar_triggers``) leaves the output free until one of its patterns matches
the text generated so far; the grammar then applies from the match on. llama.cpp's own matcher
is a recursive backtracker (``std::regex``) run over the whole output on every token, which a
client's pattern can drive into a stack overflow or an endless search. llamapy never hands a
pattern to it: each pattern is compiled here with RE2, whose matching time is linear in the
text and whose memory is bounded, and matched in Python against a bounded tail of the output
(:class:`llamapy.grammar.triggers.TriggerWatch`).

Patterns keep llama.cpp's meaning: they are matched against the output's bytes (``.`` is one
byte, as in ``std::regex``), a match anywhere triggers, ``^`` and ``$`` anchor at the output's
start and its current end, and the grammar starts at the first capturing group that matched
something (else at the match). What RE2 cannot do in linear time (look-arounds,
back-references) is refused when the request is checked.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamapy.options._spec import check

__all__ = ["MAX_TRIGGERS", "MAX_TRIGGER_LENGTH", "TriggerSet", "compile_triggers"]

#: Most trigger patterns of a lazy grammar, and the longest one (characters).
MAX_TRIGGERS = 16
MAX_TRIGGER_LENGTH = 512
#: RE2's memory budget for one compiled pattern, program and DFA cache (bytes): a larger
#: program is refused, a DFA that outgrows it falls back to the NFA.
_PATTERN_MEMORY = 1 << 18


@dataclass(frozen=True, slots=True)
class TriggerSet:
    """Compiled trigger patterns (RE2, byte semantics); see :meth:`find`."""

    patterns: tuple[str, ...]
    compiled: tuple[Any, ...]

    def find(self, text: bytes, pos: int = 0) -> int | None:
        """The offset in ``text`` where the grammar starts (the first pattern that matches
        ``text[pos:]``, llama.cpp's rule for the start), or None. ``^`` matches at ``pos``
        only when ``pos`` is 0: a tail that does not begin the output passes the byte before
        it and ``pos=1``."""
        for regex in self.compiled:
            match = regex.search(text, pos)
            if match is not None:
                return _grammar_start(match)
        return None


def _grammar_start(match: Any) -> int:
    """The first capturing group that matched a non-empty span, else the whole match."""
    for group in range(1, match.re.groups + 1):
        start, end = match.span(group)
        if start >= 0 and end > start:
            return int(start)
    return int(match.start())


def compile_triggers(patterns: Sequence[str]) -> TriggerSet:
    """Compile ``patterns`` (checked: count, length, RE2 syntax and size);
    :class:`~llamapy.errors.InvalidOptionError` naming ``grammar_triggers`` otherwise."""
    check(isinstance(patterns, list | tuple) and all(
        isinstance(p, str) and 0 < len(p) <= MAX_TRIGGER_LENGTH for p in patterns),
        "grammar_triggers", f"must be a sequence of non-empty strings of at most "
        f"{MAX_TRIGGER_LENGTH} characters")
    check(len(patterns) <= MAX_TRIGGERS, "grammar_triggers",
          f"at most {MAX_TRIGGERS} patterns, got {len(patterns)}")
    return _compiled(tuple(patterns))


@functools.lru_cache(maxsize=64)  # (at most 64 x 16 x 256 KiB held)
def _compiled(patterns: tuple[str, ...]) -> TriggerSet:
    return TriggerSet(patterns, tuple(_compile_one(p) for p in patterns))


def _options() -> Any:
    import re2  # (the option tree imports only the standard library at its top)

    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1  # bytes, as std::regex reads them
    options.log_errors = False
    options.max_mem = _PATTERN_MEMORY
    return options


def _compile_one(pattern: str) -> Any:
    import re2

    try:
        return re2.compile(pattern.encode("utf-8", "surrogatepass"), options=_options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        check(False, "grammar_triggers",
              f"pattern {pattern[:64]!r} is not supported ({reason}; patterns are matched "
              "in linear time: no look-arounds or back-references)")
        raise  # unreachable: check raised
