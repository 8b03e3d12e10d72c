"""``grammar_triggers`` (a lazy grammar's trigger patterns) is validated where it is built."""

from __future__ import annotations

import pytest

from llamapy.errors import InvalidOptionError
from llamapy.options import SamplingParams
from llamapy.options.sampling import MAX_TRIGGER_LENGTH, MAX_TRIGGERS

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
