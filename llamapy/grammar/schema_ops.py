"""Schema operations the converter needs: keyword checks, local ``$ref`` lookup, ``allOf`` merge.

Merging follows the usual generation-oriented reading of ``allOf``: properties are united
(a property in several members gets ``allOf`` of its schemas), ``required`` lists are united,
``type`` sets intersected, lower bounds raised and upper bounds lowered. Members are treated as
one object, so ``additionalProperties: false`` in one member admits the other members'
properties (stricter than the letter of JSON Schema, which would make such a schema
unsatisfiable, and what schema authors mean).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from llamapy.errors import GrammarError, UnsupportedFeatureError

#: Keywords that describe a value without constraining it; ignored.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "$schema",
        "$id",
        "$anchor",
        "$comment",
        "examples",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$defs",
        "definitions",
    }
)

#: Keywords the converter implements (some only for certain values; checked where used).
SUPPORTED = frozenset(
    {
        "type",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minLength",
        "maxLength",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)

_LOWER_BOUNDS = ("minLength", "minItems", "minimum", "exclusiveMinimum")
_UPPER_BOUNDS = ("maxLength", "maxItems", "maximum", "exclusiveMaximum")


def check_keywords(schema: Mapping[str, Any]) -> None:
    """Raise :class:`UnsupportedFeatureError` naming the first keyword we cannot honour."""
    for key in schema:
        if key not in SUPPORTED and key not in ANNOTATIONS:
            raise UnsupportedFeatureError(
                feature=key, message=f"JSON schema keyword {key!r} is not supported"
            )
    if schema.get("uniqueItems"):
        raise UnsupportedFeatureError(
            feature="uniqueItems", message="JSON schema 'uniqueItems: true' is not supported"
        )


def constraining_keys(schema: Mapping[str, Any], *, besides: tuple[str, ...] = ()) -> set[str]:
    """The keys of ``schema`` that constrain values, other than ``besides``."""
    return {key for key in schema if key not in ANNOTATIONS and key not in besides}


def resolve_pointer(document: Any, ref: str) -> Any:
    """The schema a local ``$ref`` (``#``, ``#/$defs/x``, any JSON pointer) points at."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise UnsupportedFeatureError(
            feature="$ref", message=f"only local $ref ('#/...') is supported, got {ref!r}"
        )
    target = document
    path = ref[1:]
    if path and not path.startswith("/"):
        raise UnsupportedFeatureError(
            feature="$ref", message=f"$ref to an anchor is not supported: {ref!r}"
        )
    for raw in path.split("/")[1:]:
        token = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(target, list) and token.isdigit() and int(token) < len(target):
            target = target[int(token)]
        elif isinstance(target, Mapping) and token in target:
            target = target[token]
        else:
            raise GrammarError(f"$ref {ref!r} does not resolve")
    return target


def _as_types(value: Any) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _merge_types(left: Any, right: Any) -> Any:
    lefts, rights = _as_types(left), _as_types(right)
    if lefts is None or rights is None:
        return left if rights is None else right
    both = [t for t in lefts if t in rights or (t == "integer" and "number" in rights)]
    both += [t for t in rights if t == "integer" and "number" in lefts and t not in both]
    if not both:
        raise GrammarError(f"allOf: types {left!r} and {right!r} have no value in common")
    return both[0] if len(both) == 1 else both


def _merge_additional(left: Any, right: Any) -> Any:
    if left is False or right is False:
        return False
    if left is True or left is None:
        return right
    if right is True or right is None:
        return left
    return {"allOf": [left, right]}


def _merge_key(key: str, left: Any, right: Any) -> Any:
    if key == "type":
        return _merge_types(left, right)
    if key == "properties":
        merged = dict(left)
        for name, schema in right.items():
            merged[name] = {"allOf": [merged[name], schema]} if name in merged else schema
        return merged
    if key == "required":
        return list(dict.fromkeys([*left, *right]))
    if key in ("additionalProperties", "items"):
        return _merge_additional(left, right)
    if key in _LOWER_BOUNDS:
        return max(left, right)
    if key in _UPPER_BOUNDS:
        return min(left, right)
    if key == "enum":
        both = [value for value in left if value in right]
        if not both:
            raise GrammarError("allOf: enums have no value in common")
        return both
    if key in ANNOTATIONS or left == right:
        return left
    raise UnsupportedFeatureError(
        feature="allOf", message=f"allOf: cannot merge differing {key!r} values"
    )


def merge_schemas(left: Mapping[str, Any], right: Mapping[str, Any]) -> dict[str, Any]:
    """One schema equivalent (for generation) to both ``left`` and ``right``."""
    merged = dict(left)
    for key, value in right.items():
        merged[key] = _merge_key(key, merged[key], value) if key in merged else value
    return merged
