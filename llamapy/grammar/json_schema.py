"""JSON Schema to GBNF: a grammar whose every output is an instance of the schema.

``schema_to_gbnf(schema)`` returns grammar text for llama.cpp. The grammar generates a subset
of the schema's instances, in a canonical layout: compact JSON with at most two whitespace
characters between tokens, object keys in a fixed order (required properties in
``properties`` order, then optional ones in the same order, each present or absent, then extra
keys when ``additionalProperties`` allows them), every ``prefixItems`` entry present.

Supported: ``type`` (single or list), ``properties``/``required``/``additionalProperties``
(absent means no extra keys are generated), ``enum``/``const``, ``items``/``prefixItems``/
``minItems``/``maxItems``, ``anyOf``/``oneOf`` (``oneOf`` is generated as ``anyOf``: write
branches that do not overlap), ``allOf`` (merged), local ``$ref`` with ``$defs``/
``definitions`` (recursion allowed), string ``minLength``/``maxLength`` and ``format``
``date``/``time``/``date-time``/``uuid``, integer ``minimum``/``maximum`` (and exclusive
forms), and ``minimum: 0`` on numbers. Anything else raises
:class:`~llamapy.errors.UnsupportedFeatureError` naming the keyword; a schema that no value
satisfies raises :class:`~llamapy.errors.GrammarError`. ``enum``/``const`` values are emitted as
listed (filtered by ``type``); other keywords next to them are not checked against them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from llamapy.errors import GrammarError, InvalidOptionError, UnsupportedFeatureError
from llamapy.grammar.containers import array_body, object_body
from llamapy.grammar.gbnf import GrammarBuilder, alternatives, literal, repeat, sequence
from llamapy.grammar.int_range import integer_bounds, integer_range
from llamapy.grammar.keys import excluded_key_rule
from llamapy.grammar.primitives import STRING_FORMATS, Primitives
from llamapy.grammar.schema_ops import (
    ANNOTATIONS,
    check_keywords,
    constraining_keys,
    merge_schemas,
    resolve_pointer,
)

_INFERRED_TYPES = (
    ("object", ("properties", "additionalProperties", "required")),
    ("array", ("items", "prefixItems", "additionalItems", "minItems", "maxItems")),
    ("string", ("minLength", "maxLength", "format")),
    ("number", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")),
)
_MAX_REF_CHAIN = 64
#: Deepest nesting of schemas converted. Deeper is refused (``InvalidOptionError``) well before
#: Python's recursion limit, wherever a library or the host has set it (a level takes ~5 frames).
MAX_SCHEMA_DEPTH = 100


def _infer_type(schema: Mapping[str, Any]) -> str | None:
    for kind, keys in _INFERRED_TYPES:
        if any(key in schema for key in keys):
            return kind
    return None


def _is_type(value: Any, kind: str) -> bool:
    checks = {
        "null": lambda v: v is None,
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: (
            (isinstance(v, int) and not isinstance(v, bool))
            or (isinstance(v, float) and v.is_integer())
        ),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    return checks[kind](value) if kind in checks else False


def _count(schema: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = schema.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise GrammarError(f"{key} must be a non-negative integer, got {value!r}")
    return int(value)


class SchemaConverter:
    """Turns schemas into rules of one :class:`GrammarBuilder` (several schemas may share it).

    ``rule(schema, hint)`` returns the name of a rule matching the schema; ``hint`` seeds the
    rule names. ``$ref`` resolves against the ``document`` passed to :meth:`convert`.
    """

    def __init__(self, builder: GrammarBuilder) -> None:
        self.builder = builder
        self.primitive = Primitives(builder)
        self._document: Any = None
        self._refs: dict[tuple[int, str], str] = {}
        self._depth = 0

    def convert(self, schema: Any, hint: str) -> str:
        """Rule name for a whole schema document (its ``$ref``s resolve against it)."""
        previous, self._document = self._document, schema
        try:
            return self.rule(schema, hint)
        finally:
            self._document = previous

    def define_root(self, schema: Any) -> None:
        """Make ``schema`` the grammar's ``root`` rule."""
        self._document = schema
        name = self.builder.reserve("root")
        self._refs[(id(schema), "#")] = name
        self.builder.define(name, self.body(schema, "root"))

    def rule(self, schema: Any, hint: str) -> str:
        """A rule name matching ``schema`` (an existing rule when the body is just a name)."""
        body = self.body(schema, hint)
        if re.fullmatch(r"[a-zA-Z0-9-]+", body):
            return body
        return self.builder.add(hint, body)

    def body(self, schema: Any, hint: str) -> str:
        """A GBNF expression matching ``schema`` (nested at most :data:`MAX_SCHEMA_DEPTH`
        deep)."""
        if self._depth >= MAX_SCHEMA_DEPTH:
            raise InvalidOptionError(f"json_schema: nested deeper than {MAX_SCHEMA_DEPTH} levels",
                                     option="json_schema")
        self._depth += 1
        try:
            return self._body(schema, hint)
        finally:
            self._depth -= 1

    def _body(self, schema: Any, hint: str) -> str:
        if schema is True or schema == {}:
            return self.primitive("value")
        if schema is False:
            raise GrammarError("schema 'false' matches nothing")
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a schema must be an object or a boolean, got {schema!r}")
        check_keywords(schema)
        if "$ref" in schema:
            return self._ref(schema, hint)
        if "allOf" in schema:
            return self.body(self._merge_all_of(schema), hint)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._any_of(schema, key, hint)
        if "const" in schema or "enum" in schema:
            return self._enum(schema)
        kind = schema.get("type", _infer_type(schema))
        if isinstance(kind, list):
            return self._type_union(schema, kind, hint)
        return self._typed(schema, kind, hint)

    # --- combinators ---------------------------------------------------------------------------

    def _resolved(self, schema: Any) -> Any:
        """``schema`` with its top-level ``$ref`` chain followed (siblings merged in)."""
        for _ in range(_MAX_REF_CHAIN):
            if not isinstance(schema, Mapping) or "$ref" not in schema:
                return schema
            target = resolve_pointer(self._document, schema["$ref"])
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = merge_schemas(target, rest) if constraining_keys(rest) else target
        raise GrammarError("$ref chain too long (a $ref cycle?)")

    def _ref(self, schema: Mapping[str, Any], hint: str) -> str:
        ref = schema["$ref"]
        if constraining_keys(schema, besides=("$ref",)):
            return self.body(self._resolved(schema), hint)
        key = (id(self._document), ref)
        if key not in self._refs:
            target = resolve_pointer(self._document, ref)
            name = self.builder.reserve(ref.rsplit("/", 1)[-1] or "ref")
            self._refs[key] = name
            self.builder.define(name, self.body(target, name))
        return self._refs[key]

    def _merge_all_of(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        members = schema["allOf"]
        if not isinstance(members, list):
            raise GrammarError("allOf must be a list of schemas")
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for member in members:
            member = self._resolved(member)
            if member is True:
                continue
            if not isinstance(member, Mapping):
                raise GrammarError("allOf member 'false' (or not a schema) matches nothing")
            check_keywords(member)
            if "allOf" in member:
                member = self._merge_all_of(member)
            merged = merge_schemas(merged, member)
        return merged

    def _any_of(self, schema: Mapping[str, Any], key: str, hint: str) -> str:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise GrammarError(f"{key} must be a non-empty list of schemas")
        siblings = {k: v for k, v in schema.items() if k != key and k not in ANNOTATIONS}
        options = []
        for index, branch in enumerate(branches):
            if branch is False:
                continue
            if siblings:
                resolved = self._resolved(branch)
                branch = siblings if resolved is True else merge_schemas(siblings, resolved)
            options.append(self.rule(branch, f"{hint}-{index}"))
        return alternatives(*options)

    def _enum(self, schema: Mapping[str, Any]) -> str:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list):
            raise GrammarError("enum must be a list")
        kinds = schema.get("type")
        if kinds is not None:
            kinds = [kinds] if isinstance(kinds, str) else kinds
            values = [v for v in values if any(_is_type(v, kind) for kind in kinds)]
        options = []
        for value in values:
            options.append(literal(json.dumps(value, ensure_ascii=False)))
            options.append(literal(json.dumps(value)))
        if not options:
            raise GrammarError("enum/const: no value of the allowed type")
        return alternatives(*options)

    def _type_union(self, schema: Mapping[str, Any], kinds: list[Any], hint: str) -> str:
        if not kinds:
            raise GrammarError("type: [] matches nothing")
        options = [self.rule({**schema, "type": kind}, f"{hint}-{kind}") for kind in kinds]
        return alternatives(*options)

    def _typed(self, schema: Mapping[str, Any], kind: str | None, hint: str) -> str:
        handlers: dict[str | None, Callable[[Mapping[str, Any], str], str]] = {
            None: lambda s, h: self.primitive("value"),
            "object": self._object,
            "array": self._array,
            "string": self._string,
            "integer": self._integer,
            "number": self._number,
            "boolean": lambda s, h: self.primitive("boolean"),
            "null": lambda s, h: self.primitive("null"),
        }
        if kind not in handlers:
            raise GrammarError(f"unknown JSON schema type {kind!r}")
        return handlers[kind](schema, hint)

    # --- scalars -------------------------------------------------------------------------------

    def _string(self, schema: Mapping[str, Any], hint: str) -> str:
        fmt = schema.get("format")
        if fmt is not None:
            if fmt not in STRING_FORMATS:
                supported = ", ".join(STRING_FORMATS)
                raise UnsupportedFeatureError(
                    feature="format",
                    message=f"string format {fmt!r} is not supported (supported: {supported})",
                )
            for key in ("minLength", "maxLength"):
                if key in schema:
                    raise UnsupportedFeatureError(
                        feature=key, message=f"{key} together with format is not supported"
                    )
            return self.primitive(STRING_FORMATS[fmt])
        low = _count(schema, "minLength", 0) or 0
        high = _count(schema, "maxLength", None)
        if low == 0 and high is None:
            return self.primitive("string")
        quote = literal('"')
        return sequence(quote, repeat(self.primitive("char"), low, high), quote)

    def _integer(self, schema: Mapping[str, Any], hint: str) -> str:
        low, high = integer_bounds(schema)
        if low is None and high is None:
            return self.primitive("integer")
        if low is not None and high is not None and low > high:
            raise GrammarError(f"no integer between {low} and {high}")
        return integer_range(low, high)

    def _number(self, schema: Mapping[str, Any], hint: str) -> str:
        bounds = [
            k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in schema
        ]
        if not bounds:
            return self.primitive("number")
        if bounds == ["minimum"] and schema["minimum"] == 0:
            return self.primitive("nonnegative-number")
        raise UnsupportedFeatureError(
            feature=bounds[0],
            message=f"{bounds[0]} on a 'number' is not supported (only minimum: 0; "
            "use type 'integer' for other bounds)",
        )

    # --- structures ----------------------------------------------------------------------------

    def _array(self, schema: Mapping[str, Any], hint: str) -> str:
        prefix, extra = self._array_items(schema, hint)
        low = _count(schema, "minItems", 0) or 0
        high = _count(schema, "maxItems", None)
        fixed = prefix if high is None else prefix[:high]
        extra_low = max(0, low - len(fixed))
        extra_high = 0 if extra is None else (None if high is None else high - len(fixed))
        if extra_high is not None and extra_low > extra_high:
            raise GrammarError("minItems exceeds the number of items the schema allows")
        return array_body(self.primitive("ws"), fixed, extra, extra_low, extra_high)

    def _array_items(self, schema: Mapping[str, Any], hint: str) -> tuple[list[str], str | None]:
        items = schema.get("items")
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix_schemas, rest = items, schema.get("additionalItems")
        else:
            prefix_schemas, rest = schema.get("prefixItems", []), items
            if rest is None and "prefixItems" not in schema:
                rest = True
        prefix = [self.rule(s, f"{hint}-{i}") for i, s in enumerate(prefix_schemas)]
        if rest is None or rest is False:
            return prefix, None
        return prefix, self.rule(rest, f"{hint}-item")

    def _object(self, schema: Mapping[str, Any], hint: str) -> str:
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        if properties is None and additional is None and "required" not in schema:
            return self.primitive("object")
        properties = dict(properties or {})
        required = list(schema.get("required", []))
        for name in required:
            if name not in properties:
                if additional is False:
                    raise GrammarError(f"required property {name!r} is not allowed")
                properties[name] = True if additional is None else additional
        members = {name: self._member(name, sub, hint) for name, sub in properties.items()}
        extra = None
        if additional not in (None, False):
            extra = self._extra_member(list(properties), additional, hint)
        return object_body(
            self.builder,
            self.primitive("ws"),
            hint,
            required=[member for name, member in members.items() if name in required],
            optional=[member for name, member in members.items() if name not in required],
            extra=extra,
        )

    def _member(self, name: str, schema: Any, hint: str) -> str:
        key = alternatives(literal(json.dumps(name, ensure_ascii=False)), literal(json.dumps(name)))
        ws = self.primitive("ws")
        value = self.rule(schema, f"{hint}-{name}")
        return self.builder.add(f"{hint}-{name}-kv", sequence(key, ws, literal(":"), ws, value))

    def _extra_member(self, declared: list[str], additional: Any, hint: str) -> str:
        key = excluded_key_rule(self.builder, declared, f"{hint}-extra-key")
        ws = self.primitive("ws")
        value = self.rule(additional, f"{hint}-extra-value")
        return self.builder.add(f"{hint}-extra-kv", sequence(key, ws, literal(":"), ws, value))


def schema_to_gbnf(schema: Mapping[str, Any] | bool) -> str:
    """GBNF grammar text whose outputs are JSON instances of ``schema``
    (``InvalidOptionError`` for a schema nested too deeply to convert)."""
    converter = SchemaConverter(GrammarBuilder())
    try:
        converter.define_root(schema)
    except RecursionError:
        raise InvalidOptionError("json_schema: nested too deeply", option="json_schema") from None
    return converter.builder.render()


def json_object_grammar() -> str:
    """GBNF for any JSON object (``response_format: {"type": "json_object"}``)."""
    return schema_to_gbnf({"type": "object"})
