"""schema_to_gbnf, feature by feature: the rule text, and what it accepts and rejects (types,
objects, enum/const and combinators; arrays, strings, numbers, errors: ``test_schema_values``)."""

from __future__ import annotations

import json

import pytest
from gbnf_match import Grammar
from schema_helpers import accepts, rules

from llamapy.errors import GrammarError, UnsupportedFeatureError
from llamapy.grammar import schema_to_gbnf

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
