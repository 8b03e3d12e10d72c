"""Text generated on the real model under ``schema_to_gbnf`` validates against the schema.

Through the library function the HTTP layer calls (``response_format: json_schema``). Schemas
are bounded (string lengths, array sizes, integer ranges) so each answer completes within a
small ``max_tokens`` budget.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamapy.openai_api import chat_completion
from llamapy.server import Server

MAX_TOKENS = 160

FIXED_SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 2, "maxLength": 10},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999},
        "capital": {"type": "boolean"}},
     "required": ["city", "population", "capital"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1,
     "maxItems": 3},
    {"$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -9, "maximum": 9},
        "y": {"type": "integer", "minimum": -9, "maximum": 9}}, "required": ["x", "y"],
        "additionalProperties": False}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
                                      "to": {"$ref": "#/$defs/point"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"anyOf": [{"type": "object", "properties": {"ok": {"const": True}},
                "required": ["ok"], "additionalProperties": False},
               {"type": "object", "properties": {"error": {"type": "string", "maxLength": 12}},
                "required": ["error"], "additionalProperties": False}]},
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                 "maxItems": 2},
        "nick": {"type": ["string", "null"], "maxLength": 6}},
     "required": ["name", "tags"], "additionalProperties": False},
]


def generate(server: Server, schema: Any, prompt: str = "Answer with JSON.") -> Any:
    """The parsed JSON the model writes under ``schema``'s grammar (greedy)."""
    result = chat_completion(server, {
        "messages": [{"role": "user", "content": prompt}], "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "answer", "schema": schema}}})
    choice = result["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    return json.loads(choice["message"]["content"])


@pytest.mark.parametrize("schema", FIXED_SCHEMAS, ids=lambda s: ",".join(sorted(s))[:30])
def test_fixed_schemas(server: Server, schema: dict[str, Any]) -> None:
    jsonschema.validate(generate(server, schema, "Describe a city as JSON."), schema)


# --- random bounded schemas -----------------------------------------------------------------

NAMES = st.sampled_from(["a", "id", "name", "size", "ok", "kind", "items", "note"])
LEAVES = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 100)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda values: {"enum": values},
              st.lists(st.one_of(st.integers(-3, 3), st.sampled_from(["x", "yes", "no"])),
                       min_size=1, max_size=3, unique=True)),
)


def _array(items: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda lo, extra: {"type": "array", "items": items, "minItems": lo,
                                        "maxItems": lo + extra},
                     st.integers(0, 1), st.integers(0, 2))


def _object(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def build(props: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
        required = data.draw(st.lists(st.sampled_from(sorted(props)), unique=True)) \
            if props else []
        return {"type": "object", "properties": props, "required": required,
                "additionalProperties": False}

    return st.builds(build, st.dictionaries(NAMES, children, max_size=3), st.data())


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(children.flatmap(_array), _object(children),
                               st.builds(lambda a, b: {"anyOf": [a, b]}, LEAVES, LEAVES)),
    max_leaves=5,
)


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=SCHEMAS)
def test_random_schemas(server: Server, schema: dict[str, Any]) -> None:
    jsonschema.validate(generate(server, schema), schema)
