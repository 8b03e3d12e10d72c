"""Incremental detokenisation: whole UTF-8 characters only, stop strings never leaked."""

from __future__ import annotations

from llamapy.engine.text import TextStream


def feed(stream: TextStream, pieces: list[bytes]) -> tuple[list[str], bool]:
    out, stopped = [], False
    for piece in pieces:
        text, stopped = stream.push(piece)
        out.append(text)
        if stopped:
            break
    return out, stopped


def test_split_utf8_character_is_held_until_complete():
    euro = "€".encode()
    out, _ = feed(TextStream(), [b"a", euro[:1], euro[1:2], euro[2:], b"b"])
    assert out == ["a", "", "", "€", "b"]


def test_invalid_bytes_become_replacement_and_incomplete_tail_flushes():
    s = TextStream()
    assert s.push(b"\xe2\x82")[0] == ""
    assert s.push(b"x")[0] == "\ufffdx"
    assert s.push(b"\xe2")[0] == ""
    assert s.flush() == "\ufffd"


def test_stop_string_across_tokens_is_matched_and_not_leaked():
    s = TextStream(stop=("END",))
    out, stopped = feed(s, [b"ab E", b"N", b"Dzz"])
    assert stopped and "".join(out) == "ab " and s.stop_word == "END"


def test_possible_stop_prefix_is_held_then_released():
    s = TextStream(stop=("END",))
    assert s.push(b"x E") == ("x ", False)
    assert s.push(b"Nd") == ("ENd", False)
    assert s.push(b" EN") == (" ", False)
    assert s.flush() == "EN"


def test_earliest_of_several_stop_strings_wins():
    s = TextStream(stop=("bc", "ab"))
    text, stopped = s.push(b"xabc")
    assert stopped and text == "x" and s.stop_word == "ab"


def test_stop_inside_one_piece_drops_the_rest():
    s = TextStream(stop=("\n",))
    assert s.push(b"line one\nline two") == ("line one", True)


def test_stop_string_with_multibyte_characters():
    s = TextStream(stop=("é!",))
    e = "é".encode()
    out, stopped = feed(s, [b"caf", e[:1], e[1:], b"!!"])
    assert stopped and "".join(out) == "caf"


# --- the matcher against the obvious algorithm ------------------------------------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_ALPHABET = st.text(alphabet="abé\n", max_size=6)


def _naive(stop: tuple[str, ...], pieces: list[str]) -> tuple[str, str]:
    """(released text, stop word): the earliest stop found by ``str.find`` after each piece,
    as the text so far would show it."""
    seen = ""
    for piece in pieces:
        seen += piece
        hits = [(seen.find(w), i, w) for i, w in enumerate(stop) if w in seen]
        if hits:
            at, _, word = min(hits)
            return seen[:at], word
    return seen, ""


@given(st.lists(_ALPHABET.filter(bool), min_size=1, max_size=4), st.lists(_ALPHABET, max_size=8))
def test_stream_matches_naive_search(stop: list[str], pieces: list[str]) -> None:
    """Released text plus the flushed tail, and the stop word, are what a search of the whole
    text after each piece finds (the earliest-starting match; the first listed on a tie)."""
    s = TextStream(stop=tuple(stop))
    out, stopped = feed(s, [p.encode() for p in pieces])
    text = "".join(out) + ("" if stopped else s.flush())
    assert (text, s.stop_word) == _naive(tuple(stop), pieces)


def test_long_stop_strings_hold_back_only_a_possible_match() -> None:
    """Long stop strings that nearly match for thousands of tokens: the text held back never
    exceeds the longest stop string, and the match is still found where it completes."""
    stop = tuple("a" * 1000 + str(i) for i in range(32))
    s = TextStream(stop=stop)
    released = 0
    for _ in range(2000):
        text, stopped = s.push(b"a")
        released += len(text)
        assert not stopped and len(s._pending) <= 1000
    text, stopped = s.push(b"7")
    assert stopped and s.stop_word == stop[7] and released + len(text) == 1000
