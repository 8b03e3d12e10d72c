"""schema_to_gbnf on arrays, strings and numbers (bounds, formats), its typed refusals of
unsupported or unsatisfiable schemas, and the GBNF helpers."""

from __future__ import annotations

from typing import Any

import pytest
from gbnf_match import Grammar
from schema_helpers import accepts, rules

from llamapy.errors import GrammarError, UnsupportedFeatureError
from llamapy.grammar import json_object_grammar, schema_to_gbnf
from llamapy.grammar.gbnf import GrammarBuilder, char_class, literal, repeat

# --- arrays -----------------------------------------------------------------------------------


def test_array_bounds() -> None:
    assert (
        rules({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3})["root"]
        == '"[" ws string (ws "," ws string){0,2} ws "]"'
    )
    assert rules({"type": "array", "items": {"type": "null"}, "maxItems": 2})["root"] == (
        '"[" ws (null (ws "," ws null)? ws)? "]"'
    )
    assert rules({"type": "array"})["root"] == '"[" ws (value (ws "," ws value)* ws)? "]"'
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}
    assert accepts(schema, "[1]", "[1, 2]", "[1,2,3]", "[1, 2, 3, 4]") == [False, True, True, False]


def test_prefix_items() -> None:
    schema = {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "integer"}],
        "items": {"type": "boolean"},
        "maxItems": 3,
    }
    texts = ['["a", 1]', '["a", 1, true]', '["a", 1, true, false]', '[1, "a"]']
    assert accepts(schema, *texts) == [True, True, False, False]
    closed = {"type": "array", "items": [{"type": "null"}], "additionalItems": False}
    assert accepts(closed, "[null]", "[null, null]") == [True, False]
    with pytest.raises(GrammarError, match="minItems"):
        schema_to_gbnf({"type": "array", "prefixItems": [{}], "items": False, "minItems": 2})


# --- strings and numbers -----------------------------------------------------------------------


def test_string_lengths_count_characters() -> None:
    assert rules({"type": "string", "minLength": 2, "maxLength": 5})["root"] == (
        '"\\"" char{2,5} "\\""'
    )
    assert rules({"type": "string", "minLength": 3})["root"] == '"\\"" char{3,} "\\""'
    assert rules({"type": "string", "maxLength": 5000})["root"] == '"\\"" char{0,1000} "\\""'
    schema = {"type": "string", "minLength": 2, "maxLength": 2}
    texts = ['"ab"', '"\\n\\u00e9"', '"\\ud83d\\ude00x"', '"😀x"', '"a"', '"\\ud83d"']
    assert accepts(schema, *texts) == [True, True, True, True, False, False]


def test_formats() -> None:
    dates = ['"2024-02-29"', '"2000-02-29"', '"1999-12-31"', '"2023-02-29"', '"1900-02-29"']
    assert accepts({"type": "string", "format": "date"}, *dates) == [True] * 3 + [False] * 2
    assert (
        accepts({"format": "date"}, '"2024-04-31"', '"0000-01-01"', '"2024-13-01"') == [False] * 3
    )
    times = ['"23:59:59Z"', '"00:00:00.123+05:30"', '"24:00:00Z"', '"12:00:00"']
    assert accepts({"type": "string", "format": "time"}, *times) == [True, True, False, False]
    assert accepts({"format": "date-time"}, '"2024-01-02T03:04:05-01:00"', '"2024-01-02"') == [
        True,
        False,
    ]
    uuid = '"123e4567-e89b-12d3-a456-426614174000"'
    assert accepts({"format": "uuid"}, uuid, '"123e4567e89b12d3a456426614174000"') == [True, False]


def test_integer_bounds() -> None:
    schema = {"type": "integer", "minimum": -12, "exclusiveMaximum": 105}
    grammar = Grammar.parse(schema_to_gbnf(schema))
    for number in range(-150, 150):
        assert grammar.matches(str(number)) == (-12 <= number < 105), number
    assert accepts({"type": "integer", "minimum": 0}, "0", "9999999999999999", "-1") == [
        True,
        True,
        False,
    ]
    draft4 = {"type": "integer", "minimum": 1, "exclusiveMinimum": True, "maximum": 3}
    assert accepts(draft4, "1", "2", "3", "4") == [False, True, True, False]
    assert accepts({"type": "integer", "minimum": 1.5, "maximum": 2.5}, "1", "2", "3") == [
        False,
        True,
        False,
    ]
    with pytest.raises(GrammarError, match="no integer"):
        schema_to_gbnf({"type": "integer", "minimum": 5, "maximum": 4})


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "feature"),
    [
        ({"type": "string", "pattern": "^a"}, "pattern"),
        ({"type": "object", "patternProperties": {"a": {}}}, "patternProperties"),
        ({"not": {"type": "null"}}, "not"),
        ({"if": {}, "then": {}}, "if"),
        ({"type": "object", "minProperties": 1}, "minProperties"),
        ({"type": "integer", "multipleOf": 2}, "multipleOf"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "array", "contains": {}}, "contains"),
        ({"type": "string", "format": "email"}, "format"),
        ({"type": "string", "format": "date", "maxLength": 3}, "maxLength"),
        ({"type": "number", "maximum": 3}, "maximum"),
        ({"type": "number", "minimum": 1}, "minimum"),
        ({"$ref": "https://example.com/schema.json"}, "$ref"),
        ({"$ref": "#anchor"}, "$ref"),
        ({"properties": {"deep": {"items": {"pattern": "x"}}}}, "pattern"),
    ],
)
def test_unsupported_features_are_named(schema: dict[str, Any], feature: str) -> None:
    with pytest.raises(UnsupportedFeatureError) as info:
        schema_to_gbnf(schema)
    assert info.value.feature == feature
    assert info.value.http_status == 400
    assert feature in str(info.value)


@pytest.mark.parametrize(
    "schema",
    [
        False,
        {"type": []},
        {"type": "text"},
        {"enum": []},
        {"type": "integer", "enum": ["a"]},
        {"anyOf": []},
        {"type": "array", "minItems": 3, "maxItems": 2},
        {"type": "string", "minLength": -1},
        {"$ref": "#/$defs/missing"},
        {"allOf": [{"type": "string"}, False]},
        "not a schema",
    ],
)
def test_unsatisfiable_or_malformed_schemas(schema: Any) -> None:
    with pytest.raises(GrammarError):
        schema_to_gbnf(schema)


def test_annotations_are_ignored() -> None:
    annotated = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "T",
        "description": "d",
        "default": 1,
        "examples": [1],
        "deprecated": False,
        "type": "integer",
    }
    assert schema_to_gbnf(annotated) == schema_to_gbnf({"type": "integer"})


def test_json_object_grammar() -> None:
    grammar = Grammar.parse(json_object_grammar())
    texts = ['{"a": [1, 2.5, "x", null, true, {"b": {}}]}', "{}", "[]", '"x"', " {}"]
    assert [grammar.matches(t) for t in texts] == [True, True, False, False, False]


# --- GBNF helpers --------------------------------------------------------------------------------


def test_gbnf_text_helpers() -> None:
    assert literal('a"b\\c\n\t\x01é😀') == '"a\\"b\\\\c\\n\\t\\x01\\u00E9\\U0001F600"'
    assert char_class("]-^", ranges=(("a", "z"),), negated=True) == "[^\\]\\-\\^a-z]"
    assert repeat("x", 0, None) == "x*"
    assert repeat("x", 1, None) == "x+"
    assert repeat("x", 0, 1) == "x?"
    assert repeat("a b", 2, 2) == "(a b){2}"
    assert repeat("x", 2, None) == "x{2,}"
    assert repeat("x", 0, 0) == '""'
    with pytest.raises(GrammarError):
        repeat("x", 3, 2)


def test_grammar_builder() -> None:
    builder = GrammarBuilder()
    first = builder.add("my rule!", '"a"')
    assert first == "my-rule"
    assert builder.add("other", '"a"') == first  # same body, same rule
    assert builder.add("my rule!", '"b"') == "my-rule-2"
    pending = builder.reserve("root")
    with pytest.raises(GrammarError, match="never defined"):
        builder.render()
    builder.define(pending, first)
    with pytest.raises(GrammarError):
        builder.define(pending, first)
    assert builder.render().splitlines()[0] == "root ::= my-rule"
    with pytest.raises(GrammarError, match="no root"):
        GrammarBuilder().render()
