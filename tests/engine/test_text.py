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
