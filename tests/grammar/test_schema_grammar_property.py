"""Property tests of schema_to_gbnf against jsonschema, through a pure-Python GBNF matcher.

- complete: valid instances (grammar layout, either ``ensure_ascii``) are accepted;
- sound: every string the grammar generates parses and validates against the schema
  (the CPU stand-in for "every output generated under the grammar validates");
- exact: random JSON values that the schema rejects, the grammar rejects too.
"""

from __future__ import annotations

import json
import random
from typing import Any

from gbnf_match import Grammar
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_strategies import ANY_JSON, Pair, schemas, validator

from llamapy.grammar import schema_to_gbnf

# max_examples comes from the active profile (tests/conftest.py: dev fast, ci thorough)
SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def grammar_for(schema: dict[str, Any]) -> Grammar:
    return Grammar.parse(schema_to_gbnf(schema))


@SETTINGS
@given(case=schemas(), data=st.data())
def test_valid_instances_are_accepted(case: Pair, data: st.DataObject) -> None:
    schema, values = case
    grammar = grammar_for(schema)
    check = validator(schema)
    for _ in range(3):
        instance = data.draw(values, label="instance")
        assert check.is_valid(instance), "the test's instance generator is wrong"
        for ensure_ascii in (False, True):
            text = json.dumps(instance, ensure_ascii=ensure_ascii)
            assert grammar.matches(text), text


@SETTINGS
@given(case=schemas(), seed=st.integers(0, 2**32 - 1))
def test_everything_the_grammar_generates_validates(case: Pair, seed: int) -> None:
    schema, _ = case
    grammar = grammar_for(schema)
    check = validator(schema)
    rng = random.Random(seed)
    for _ in range(4):
        text = grammar.sample(rng)
        instance = json.loads(text)
        errors = [error.message for error in check.iter_errors(instance)]
        assert not errors, (text, errors)
        assert grammar.matches(text)


@SETTINGS
@given(case=schemas(), other=ANY_JSON)
def test_invalid_values_are_rejected(case: Pair, other: Any) -> None:
    schema, _ = case
    if validator(schema).is_valid(other):
        return
    assert not grammar_for(schema).matches(json.dumps(other))
