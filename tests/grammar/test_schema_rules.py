"""schema_to_gbnf, feature by feature: the rule text, and what it accepts and rejects."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from gbnf_match import Grammar

from llamapy.errors import GrammarError, UnsupportedFeatureError
from llamapy.grammar import json_object_grammar, schema_to_gbnf
from llamapy.grammar.gbnf import GrammarBuilder, char_class, literal, repeat


def rules(schema: Any) -> dict[str, str]:
    text = schema_to_gbnf(schema)
    assert text.startswith("root ::= ")
    out = {}
    for line in text.splitlines():
        name, _, body = line.partition(" ::= ")
        assert re.fullmatch(r"[a-zA-Z0-9-]+", name), name
        out[name] = body
    return out


def accepts(schema: Any, *texts: str) -> list[bool]:
    grammar = Grammar.parse(schema_to_gbnf(schema))
    return [grammar.matches(text) for text in texts]


# --- primitive types ---------------------------------------------------------------------------


def test_scalar_types() -> None:
    assert rules({"type": "string"})["root"] == "string"
    assert rules({"type": "string"})["string"] == '"\\"" char* "\\""'
    assert rules({"type": "integer"})["integer"] == '"-"? ("0" | [1-9] [0-9]{0,15})'
    assert rules({"type": "number"})["number"] == (
        '"-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,20})? ([eE] [-+]? [0-9]{1,3})?'
    )
    assert rules({"type": "boolean"})["boolean"] == '"true" | "false"'
    assert rules({"type": "null"})["null"] == '"null"'
    assert rules({"type": "string"})["char"].startswith('[^"\\\\\\x00-\\x1F] | ')


def test_any_value_and_type_lists() -> None:
    for schema in ({}, True, {"description": "anything"}):
        assert rules(schema)["root"] == "value"
    assert rules({"type": ["string", "null"]})["root"] == "string | null"
    assert accepts({"type": ["integer", "boolean"]}, "12", "true", '"x"') == [True, True, False]


def test_number_forms() -> None:
    texts = ["0", "-1.5", "1e+16", "2.5E-3", "12345678901234567", "01", "1.", ".5"]
    assert accepts({"type": "number"}, *texts) == [True] * 4 + [False] * 4
    assert accepts({"type": "number", "minimum": 0}, "0.5", "-0.5", "3") == [True, False, True]


def test_whitespace_is_bounded() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    texts = ['{"a":1}', '{ "a" : 1 }', '{\n\t"a": 1}', '{   "a": 1}', ' {"a": 1}']
    assert accepts(schema, *texts) == [True, True, True, False, False]


# --- objects -----------------------------------------------------------------------------------


def test_required_first_then_optional_in_property_order() -> None:
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in "cabd"},
        "required": ["d", "a"],
    }
    r = rules(schema)
    assert r["root"] == '"{" ws root-a-kv ws "," ws root-d-kv (ws "," ws root-tail-0)? ws "}"'
    assert r["root-tail-0"] == 'root-c-kv (ws "," ws root-b-kv)? | root-b-kv'
    assert r["root-a-kv"] == '"\\"a\\"" ws ":" ws integer'
    texts = [
        '{"a": 1, "d": 2}',
        '{"a": 1, "d": 2, "c": 3, "b": 4}',
        '{"a": 1, "d": 2, "b": 4}',
        '{"d": 2, "a": 1}',  # order is fixed
        '{"a": 1}',  # d is required
        '{"a": 1, "d": 2, "b": 4, "c": 3}',
        '{"a": 1, "d": 2, "e": 5}',  # no extra keys unless allowed
    ]
    assert accepts(schema, *texts) == [True, True, True, False, False, False, False]


def test_all_optional_object() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "null"}, "y": {"type": "null"}}}
    assert rules(schema)["root"] == '"{" ws (root-tail-0 ws)? "}"'
    texts = ["{}", '{"x": null}', '{"y": null}', '{"x": null, "y": null}', '{, "y": null}']
    assert accepts(schema, *texts) == [True, True, True, True, False]


def test_additional_properties() -> None:
    base = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    closed = {**base, "additionalProperties": False}
    assert accepts(closed, '{"a": 1}', '{"a": 1, "b": 2}') == [True, False]
    open_ = {**base, "additionalProperties": True}
    assert accepts(open_, '{"a": 1, "b": [2], "c": {}}', '{"a": 1, "b": 2}') == [True, True]
    typed = {**base, "additionalProperties": {"type": "string"}}
    assert accepts(typed, '{"a": 1, "b": "x"}', '{"a": 1, "b": 2}') == [True, False]
    assert rules({"type": "object"})["root"] == "object"
    assert accepts({"type": "object"}, '{"k": [1, {"n": null}]}', "[]") == [True, False]


def test_extra_keys_never_repeat_declared_ones() -> None:
    declared = ["a", "ab", "", 'q"', "é", "line\nbreak"]
    schema = {
        "type": "object",
        "properties": {name: {"type": "integer"} for name in declared},
        "additionalProperties": {"type": "string"},
    }
    grammar = Grammar.parse(schema_to_gbnf(schema))
    for name in declared:
        extra = json.dumps({name: "not an integer"}, ensure_ascii=False)
        assert not grammar.matches(extra), extra
        assert grammar.matches(json.dumps({name: 1}, ensure_ascii=False))
    for near in ["b", "abc", "a b", "q", 'q""', "éé", "line"]:
        assert grammar.matches(json.dumps({near: "ok"}, ensure_ascii=False)), near


def test_unusual_property_names_are_escaped() -> None:
    names = ['say "hi"', "back\\slash", "tab\there", "naïve", "emoji 😀", "", "x-y z"]
    schema = {"type": "object", "properties": {n: {"const": 1} for n in names}, "required": names}
    instance = dict.fromkeys(names, 1)
    assert accepts(schema, json.dumps(instance), json.dumps(instance, ensure_ascii=False)) == [
        True,
        True,
    ]


def test_required_property_without_schema() -> None:
    schema = {"type": "object", "required": ["id"]}
    assert accepts(schema, '{"id": [1]}', "{}") == [True, False]
    with pytest.raises(GrammarError, match="required property 'id'"):
        schema_to_gbnf({**schema, "additionalProperties": False})


def test_nested_object_rule_names() -> None:
    schema = {
        "type": "object",
        "properties": {
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            }
        },
        "required": ["address"],
    }
    r = rules(schema)
    assert r["root-address-kv"] == '"\\"address\\"" ws ":" ws root-address'
    assert r["root-address"] == '"{" ws root-address-city-kv ws "}"'


# --- enum, const, combinators ------------------------------------------------------------------


def test_enum_and_const() -> None:
    assert rules({"enum": ["a", 1, None, True]})["root"] == '"\\"a\\"" | "1" | "null" | "true"'
    assert rules({"const": "é"})["root"] == '"\\"\\u00E9\\"" | "\\"\\\\u00e9\\""'
    assert rules({"type": "string", "enum": ["a", 1]})["root"] == '"\\"a\\""'
    assert accepts({"const": {"k": [1, 2]}}, '{"k": [1, 2]}', '{"k": [2, 1]}') == [True, False]


def test_any_of_and_one_of() -> None:
    schema = {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {}}]}
    assert rules(schema)["root"] == "integer | root-1"
    assert rules({"oneOf": [{"type": "null"}, {"type": "string"}]})["root"] == "null | string"
    assert accepts(schema, "3", "{}", '"x"') == [True, True, False]


def test_any_of_merges_sibling_keywords_into_branches() -> None:
    schema = {
        "type": "object",
        "properties": {"kind": {"type": "string"}},
        "anyOf": [{"required": ["kind"]}, {"properties": {"n": {"type": "integer"}}}],
    }
    texts = ['{"kind": "a"}', '{"n": 1}', "{}", '{"kind": 1}']
    assert accepts(schema, *texts) == [True, True, True, False]


def test_all_of_merges_objects() -> None:
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string", "maxLength": 2}}, "required": ["b"]},
            {"properties": {"b": {"minLength": 1}}},
        ]
    }
    texts = ['{"a": 1, "b": "xy"}', '{"a": 1, "b": ""}', '{"a": 1, "b": "xyz"}', '{"a": 1}']
    assert accepts(schema, *texts) == [True, False, False, False]
    with pytest.raises(GrammarError, match="no value in common"):
        schema_to_gbnf({"allOf": [{"type": "string"}, {"type": "integer"}]})
    with pytest.raises(UnsupportedFeatureError) as info:
        schema_to_gbnf({"allOf": [{"format": "date"}, {"format": "uuid"}]})
    assert info.value.feature == "allOf"


def test_refs_and_recursion() -> None:
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value", "children"],
            }
        },
        "$ref": "#/$defs/node",
    }
    r = rules(schema)
    assert r["root"] == "node"
    assert r["node-children"] == '"[" ws (node (ws "," ws node)* ws)? "]"'
    tree = {"value": 1, "children": [{"value": 2, "children": [{"value": 3, "children": []}]}]}
    assert accepts(schema, json.dumps(tree), '{"value": 1, "children": [{}]}') == [True, False]
    listy = {
        "type": "object",
        "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["next"],
        "definitions": {},
    }
    assert accepts(listy, '{"next": {"next": null}}', '{"next": 1}') == [True, False]


def test_ref_with_siblings_and_definitions() -> None:
    schema = {
        "definitions": {"name": {"type": "string"}},
        "type": "object",
        "properties": {"n": {"$ref": "#/definitions/name", "maxLength": 1}},
        "required": ["n"],
    }
    assert accepts(schema, '{"n": "a"}', '{"n": "ab"}') == [True, False]


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

