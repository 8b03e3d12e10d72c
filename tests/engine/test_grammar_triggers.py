"""``grammar_triggers`` (a lazy grammar's trigger patterns) is validated where it is built."""

from __future__ import annotations

import pytest

from llamapy.errors import InvalidOptionError, TriggerTooCostlyError
from llamapy.grammar.triggers import TriggerHit, TriggerWatch, gbnf_literal, prefixed_grammar
from llamapy.options import SamplingParams
from llamapy.options.triggers import MAX_TRIGGER_LENGTH, MAX_TRIGGERS, compile_triggers

GRAMMAR = 'root ::= "x"'


def test_triggers_are_kept_as_a_tuple() -> None:
    params = SamplingParams(grammar=GRAMMAR, grammar_triggers=["<tool_call>"])
    assert params.grammar_triggers == ("<tool_call>",)
    assert SamplingParams().grammar_triggers == ()


@pytest.mark.parametrize("triggers", [
    "<tool_call>", [1], [""], ["x" * (MAX_TRIGGER_LENGTH + 1)], ["a"] * (MAX_TRIGGERS + 1)])
def test_bad_triggers_are_refused(triggers: object) -> None:
    with pytest.raises(InvalidOptionError, match="grammar_triggers"):
        SamplingParams(grammar=GRAMMAR, grammar_triggers=triggers)  # type: ignore[arg-type]


def test_triggers_need_a_grammar() -> None:
    with pytest.raises(InvalidOptionError, match="need a grammar"):
        SamplingParams(grammar_triggers=["<tool_call>"])


@pytest.mark.parametrize("pattern", ["(?=x)", "(?!all)", r"(a)\1", "(?<=a)b", "(a{100}){100}"])
def test_patterns_a_linear_matcher_cannot_run_are_refused(pattern: str) -> None:
    with pytest.raises(InvalidOptionError, match="grammar_triggers: pattern"):
        SamplingParams(grammar=GRAMMAR, grammar_triggers=[pattern])


# --- the watch: patterns matched against a bounded tail of the output ----------------------

BOMBS = ["(" * 250 + "a" + ")" * 250, ".{32}(.|.|.)*x", "(a*)*b", "(x+x+)+y", "(.*){12}z"]


def feed_all(watch: TriggerWatch, pieces: list[bytes]) -> TriggerHit | None:
    hit = None
    for token, piece in enumerate(pieces):
        hit = watch.feed(token, piece)
        if hit is not None:
            return hit
    return hit


def test_a_word_trigger_replays_from_the_token_it_starts_in() -> None:
    watch = TriggerWatch(compile_triggers(["<tool_call>"]))
    hit = feed_all(watch, [b"I will", b" call.<to", b"ol_", b"call>", b"{"])
    assert hit == TriggerHit(tokens=(1, 2, 3), prefix=b" call.")


def test_the_grammar_starts_at_the_first_group_that_matched() -> None:
    watch = TriggerWatch(compile_triggers([r"[\s\S]*?(<call>)"]))
    hit = feed_all(watch, [b"text ", b"<call>"])
    assert hit == TriggerHit(tokens=(1,), prefix=b"")


def test_a_pattern_matches_bytes_as_llama_cpp_does() -> None:
    """``.`` is one byte; a non-ASCII literal matches its UTF-8 bytes."""
    watch = TriggerWatch(compile_triggers(["é(..)"]))
    hit = feed_all(watch, ["aé".encode(), "ü".encode()])
    assert hit == TriggerHit(tokens=(1,), prefix=b"")


def test_a_prefix_is_whole_characters() -> None:
    """A match that starts right after a character split across tokens replays from the token
    where the character starts."""
    e_acute = "é".encode()
    watch = TriggerWatch(compile_triggers(["<x>"]))
    hit = feed_all(watch, [b"a" + e_acute[:1], e_acute[1:] + b"<x>"])
    assert hit == TriggerHit(tokens=(0, 1), prefix=b"a" + e_acute)


def test_the_tail_is_bounded_and_caret_stops_matching_once_it_slid() -> None:
    watch = TriggerWatch(compile_triggers(["^b", "zz"]), tail_bytes=64)
    assert feed_all(watch, [b"a" * 10] * 50) is None
    assert watch.num_bytes <= 64 + 10
    assert watch.feed(99, b"b") is None  # ^ is the output's start, not the tail's
    assert watch.feed(100, b"zz") == TriggerHit(tokens=(100,), prefix=b"")


def test_anchored_patterns_match_the_output_so_far() -> None:
    watch = TriggerWatch(compile_triggers([r"^\s*(\{)$"]))
    assert watch.feed(0, b"  ") is None
    assert watch.feed(1, b"{") == TriggerHit(tokens=(1,), prefix=b"")


@pytest.mark.parametrize("pattern", BOMBS)
def test_regex_bombs_run_in_linear_time(pattern: str) -> None:
    """Patterns that send a backtracker into deep recursion or an endless search: 2,000 tokens
    through the watch (each matched against up to 4 KiB) end, and nothing matches."""
    watch = TriggerWatch(compile_triggers([pattern]))
    assert all(watch.feed(i, b"qqqq.... ") is None for i in range(2_000))


def test_the_prefixed_grammar_reads_the_prefix_first() -> None:
    grammar = 'root ::= "x"\n# llamapy-trigger-prefix llamapy-trigger-prefix-x'
    text, root = prefixed_grammar(grammar, "root", b'a "q"\n\\')
    assert root.startswith("llamapy-trigger-") and root not in grammar
    assert text.endswith(f'{root} ::= "a \\"q\\"\\x0A\\\\" root\n')
    assert prefixed_grammar('root ::= "x"', "root", b"") == ('root ::= "x"', "root")
    assert gbnf_literal("é".encode()) == '"é"'


def test_patterns_that_cost_too_much_a_token_end_the_request() -> None:
    """A pattern RE2 runs in its NFA costs milliseconds a token over a full tail: the watch
    counts its thread time and raises before it holds the model's thread for long."""
    watch = TriggerWatch(compile_triggers([r"([\x00-\xff]*e){1,200}q",
                                           r"(.*(e|h).*){1,100}q(.*){1,50}z"]))
    with pytest.raises(TriggerTooCostlyError, match="grammar_triggers"):
        for i in range(2_000):
            watch.feed(i, b"the quick brown fox ")


def test_common_patterns_never_count_as_too_costly() -> None:
    """llama.cpp's chat layer's kinds of triggers, 16 at once, over 5,000 tokens."""
    patterns = ["<tool_call>", r"[\s\S]*?(<tool_call>)[\s\S]*", r"^\s*(\{)", "[TOOL_CALLS]",
                r"<\|start\|>assistant(\s+to)", r"(?:```json\s*)?(\{\s*\"name\")"] * 2
    patterns += ["<function=", "<invoke", r"<\|tool_calls_section_begin\|>", r"\[\{"]
    watch = TriggerWatch(compile_triggers(patterns))
    assert all(watch.feed(i, b" some words ") is None for i in range(5_000))
