"""Stop strings: a match after a false start that overlaps it (the automaton's fallbacks), and
matching work per character that does not grow with the stop strings' length."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import pytest

from llamapy.engine import text as text_module
from llamapy.engine.text import TextStream


@pytest.mark.parametrize(("stop", "pieces", "released"), [
    ("aab", ["a", "a", "a", "b", "c"], "a"),  # a false start overlapping the match
    ("abab", ["ab", "a", "ababx"], "aba"),
    ("ééa", ["é", "ééa"], "é"),
    ("abcabd", ["abcab", "cabd"], "abc"),  # the border "ab" carries over
])
def test_a_stop_string_is_found_after_a_false_start_that_overlaps_it(
        stop: str, pieces: list[str], released: str) -> None:
    stream, out = TextStream(stop=(stop,)), []
    for piece in pieces:
        text, stopped = stream.push(piece.encode())
        out.append(text)
        if stopped:
            break
    assert stopped and "".join(out) == released and stream.stop_word == stop


def _lines_run(stop: tuple[str, ...], text: str) -> int:
    """Python lines of :mod:`llamapy.engine.text` run while ``text`` is pushed one character
    at a time: a measure of work that does not depend on the machine's speed."""
    stream, count = TextStream(stop=stop), 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        count += event == "line"
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == text_module.__file__ else None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        for ch in text:
            stream.push(ch.encode())
    finally:
        sys.settrace(previous)
    return count


def test_matching_work_per_character_does_not_grow_with_stop_length() -> None:
    """Eight stop strings, the last one keeping a long run of "a" held back, the others never
    matching: the work per character is the same whether they are 30 or 300 characters long
    (a scan of the held text for each stop string at each token does about seven times more
    here)."""
    def stops(n: int) -> tuple[str, ...]:
        return (*("b" * n + str(i) for i in range(7)), "a" * n + "x")

    short, long = _lines_run(stops(30), "a" * 600), _lines_run(stops(300), "a" * 600)
    assert long <= 1.2 * short
