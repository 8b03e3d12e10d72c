"""The schema converter's own depth bound: a schema nested past ``MAX_SCHEMA_DEPTH`` is a typed
refusal, whatever Python's recursion limit (which libraries move) is."""

from __future__ import annotations

import sys

import pytest

from llamapy.errors import InvalidOptionError
from llamapy.grammar import schema_to_gbnf


def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize("recursion_limit", [1000, 100_000])
def test_a_schema_nested_past_the_bound_is_refused_whatever_the_recursion_limit(
        recursion_limit: int) -> None:
    """The bound is the converter's own, not Python's recursion limit (which libraries move):
    the same schema gets the same typed refusal either way."""
    from llamapy.grammar.json_schema import MAX_SCHEMA_DEPTH

    before = sys.getrecursionlimit()
    sys.setrecursionlimit(recursion_limit)
    try:
        assert "root ::=" in schema_to_gbnf(_nested(MAX_SCHEMA_DEPTH - 1))
        with pytest.raises(InvalidOptionError) as info:
            schema_to_gbnf(_nested(MAX_SCHEMA_DEPTH))
        assert info.value.option == "json_schema"
        with pytest.raises(InvalidOptionError):
            schema_to_gbnf(_nested(3 * MAX_SCHEMA_DEPTH))
    finally:
        sys.setrecursionlimit(before)
