"""Hypothesis strategies: random JSON schemas (within what the converter supports) paired with
a strategy for their valid instances, laid out the way the grammar lays them out (required keys
first, in ``properties`` order, then optional ones, then extra keys; every prefix item present).
"""

from __future__ import annotations

import datetime
import json
import re
import string
from typing import Any

from hypothesis import strategies as st
from jsonschema import Draft202012Validator, FormatChecker

Pair = tuple[dict[str, Any], st.SearchStrategy[Any]]

MAX_INT = 10**15
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-MAX_INT, MAX_INT), st.text(max_size=6)
)
ANY_JSON = st.recursive(
    JSON_SCALARS | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
PROPERTY_NAMES = st.text(alphabet=st.sampled_from('ab_ "\\/é日\n\t-1'), max_size=5)
EXTRA_KEYS = st.text(alphabet=string.ascii_letters + string.digits + ' _-"\\', max_size=5)


# --- format checking (jsonschema needs extra packages for time and date-time) -------------------

_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(\.\d+)?([zZ]|[+-](\d\d):(\d\d))")


def _is_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    match = _TIME.fullmatch(value)
    if not match:
        return False
    hour, minute, second = int(match[1]), int(match[2]), int(match[3])
    offset_ok = match[6] is None or (int(match[6]) < 24 and int(match[7]) < 60)
    return hour < 24 and minute < 60 and second < 60 and offset_ok


def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    date, sep, time = value.partition("T") if "T" in value else value.partition("t")
    if not sep or not re.fullmatch(r"\d{4}-\d\d-\d\d", date):
        return False
    try:
        datetime.date.fromisoformat(date)
    except ValueError:
        return False
    return _is_time(time)


def validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A 2020-12 validator that also checks the formats we generate."""
    checker = FormatChecker()
    checker.checks("time")(_is_time)
    checker.checks("date-time")(_is_date_time)
    return Draft202012Validator(schema, format_checker=checker)


# --- leaves --------------------------------------------------------------------------------------


@st.composite
def strings(draw: st.DrawFn) -> Pair:
    low = draw(st.integers(0, 3))
    high = draw(st.none() | st.integers(low, low + 5))
    schema: dict[str, Any] = {"type": "string"}
    if low:
        schema["minLength"] = low
    if high is not None:
        schema["maxLength"] = high
    return schema, st.text(min_size=low, max_size=high if high is not None else low + 6)


def _times() -> st.SearchStrategy[str]:
    zones = st.sampled_from(["Z", "z", "+00:00", "-05:30", "+23:59"])
    return st.builds(lambda t, z: t.isoformat() + z, st.times(), zones)


FORMATS = {
    "date": st.dates().map(datetime.date.isoformat),
    "time": _times(),
    "date-time": st.builds(lambda d, t: d.isoformat() + "T" + t, st.dates(), _times()),
    "uuid": st.uuids().map(str),
}


@st.composite
def formatted(draw: st.DrawFn) -> Pair:
    name = draw(st.sampled_from(sorted(FORMATS)))
    return {"type": "string", "format": name}, FORMATS[name]


@st.composite
def integers(draw: st.DrawFn) -> Pair:
    low = draw(st.none() | st.integers(-1000, 1000))
    high = draw(st.none() | st.integers(low if low is not None else -1000, 2000))
    schema: dict[str, Any] = {"type": "integer"}
    if low is not None:
        exclusive = draw(st.booleans())
        schema["exclusiveMinimum" if exclusive else "minimum"] = low - 1 if exclusive else low
    if high is not None:
        exclusive = draw(st.booleans())
        schema["exclusiveMaximum" if exclusive else "maximum"] = high + 1 if exclusive else high
    bounds = (-MAX_INT if low is None else low, MAX_INT if high is None else high)
    return schema, st.integers(*bounds)


@st.composite
def numbers(draw: st.DrawFn) -> Pair:
    if draw(st.booleans()):
        values = st.floats(min_value=0.0, allow_infinity=False) | st.integers(0, MAX_INT)
        return {"type": "number", "minimum": 0}, values.filter(lambda v: str(v) != "-0.0")
    values = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-MAX_INT, MAX_INT)
    return {"type": "number"}, values


@st.composite
def enums(draw: st.DrawFn) -> Pair:
    values = draw(st.lists(JSON_SCALARS, min_size=1, max_size=4, unique_by=json.dumps))
    if len(values) == 1 and draw(st.booleans()):
        return {"const": values[0]}, st.just(values[0])
    return {"enum": values}, st.sampled_from(values)


def simple(kind: str) -> Pair:
    return {
        "boolean": ({"type": "boolean"}, st.booleans()),
        "null": ({"type": "null"}, st.none()),
        "any": ({}, ANY_JSON),
    }[kind]


@st.composite
def nullable_strings(draw: st.DrawFn) -> Pair:
    schema, values = draw(strings())
    return {**schema, "type": ["string", "null"]}, values | st.none()


@st.composite
def one_ofs(draw: st.DrawFn) -> Pair:
    """oneOf of branches with distinct types, so that exactly one branch matches."""
    makers = {
        "string": strings(),
        "integer": integers(),
        "boolean": st.just(simple("boolean")),
        "null": st.just(simple("null")),
    }
    kinds = draw(st.lists(st.sampled_from(sorted(makers)), min_size=2, max_size=3, unique=True))
    pairs = [draw(makers[kind]) for kind in kinds]
    return {"oneOf": [s for s, _ in pairs]}, st.one_of(*(v for _, v in pairs))


LEAVES = st.one_of(
    strings(),
    formatted(),
    integers(),
    numbers(),
    enums(),
    nullable_strings(),
    one_ofs(),
    st.sampled_from(["boolean", "null", "any"]).map(simple),
)


# --- structures ----------------------------------------------------------------------------------


def object_instances(
    properties: dict[str, st.SearchStrategy[Any]],
    required: set[str],
    extra_values: st.SearchStrategy[Any] | None,
) -> st.SearchStrategy[dict[str, Any]]:
    """Instances in grammar order: required, then optional (each maybe), then extra keys."""

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        out = {name: draw(values) for name, values in properties.items() if name in required}
        for name, values in properties.items():
            if name not in required and draw(st.booleans()):
                out[name] = draw(values)
        if extra_values is not None:
            keys = draw(
                st.lists(EXTRA_KEYS.filter(lambda k: k not in properties), max_size=2, unique=True)
            )
            out.update({key: draw(extra_values) for key in keys})
        return out

    return build()


def objects(children: st.SearchStrategy[Pair]) -> st.SearchStrategy[Pair]:
    @st.composite
    def build(draw: st.DrawFn) -> Pair:
        props = draw(st.dictionaries(PROPERTY_NAMES, children, max_size=4))
        required = draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
        additional = draw(st.sampled_from(["absent", "false", "true", "schema"]))
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {name: s for name, (s, _) in props.items()},
        }
        if required:
            schema["required"] = required
        extra_values = None
        if additional == "false":
            schema["additionalProperties"] = False
        elif additional == "true":
            schema["additionalProperties"] = True
            extra_values = ANY_JSON
        elif additional == "schema":
            extra_schema, extra_values = draw(children)
            schema["additionalProperties"] = extra_schema
        values = {name: v for name, (_, v) in props.items()}
        return schema, object_instances(values, set(required), extra_values)

    return build()


def all_ofs(children: st.SearchStrategy[Pair]) -> st.SearchStrategy[Pair]:
    """allOf of two object schemas that split one object's properties between them."""

    @st.composite
    def build(draw: st.DrawFn) -> Pair:
        props = draw(st.dictionaries(PROPERTY_NAMES, children, min_size=1, max_size=4))
        names = list(props)
        required = set(draw(st.lists(st.sampled_from(names), unique=True)))
        cut = draw(st.integers(0, len(names)))
        members = []
        for group in (names[:cut], names[cut:]):
            member: dict[str, Any] = {"properties": {n: props[n][0] for n in group}}
            member["required"] = [n for n in group if n in required]
            members.append(member)
        schema = {"type": "object", "allOf": members}
        values = {name: props[name][1] for name in names}
        return schema, object_instances(values, required, None)

    return build()


def arrays(children: st.SearchStrategy[Pair]) -> st.SearchStrategy[Pair]:
    @st.composite
    def build(draw: st.DrawFn) -> Pair:
        prefix = draw(st.lists(children, max_size=2))
        item = draw(st.none() | children) if prefix else draw(children)
        low = draw(st.integers(0, 2))
        high = draw(st.none() | st.integers(max(low, 1), low + 3))
        if item is None:
            low = min(low, len(prefix))
        schema: dict[str, Any] = {"type": "array", "items": False if item is None else item[0]}
        if prefix:
            schema["prefixItems"] = [s for s, _ in prefix]
        if low:
            schema["minItems"] = low
        if high is not None:
            schema["maxItems"] = high
        fixed = prefix if high is None else prefix[:high]
        extra_low = max(0, low - len(fixed))
        extra_high = 0 if item is None else (extra_low + 3 if high is None else high - len(fixed))
        extras = st.lists(item[1], min_size=extra_low, max_size=extra_high) if item else st.just([])
        return schema, st.tuples(st.tuples(*(v for _, v in fixed)), extras).map(
            lambda parts: [*parts[0], *parts[1]]
        )

    return build()


def any_ofs(children: st.SearchStrategy[Pair]) -> st.SearchStrategy[Pair]:
    return st.lists(children, min_size=1, max_size=3).map(
        lambda pairs: ({"anyOf": [s for s, _ in pairs]}, st.one_of(*(v for _, v in pairs)))
    )


def _extend(children: st.SearchStrategy[Pair]) -> st.SearchStrategy[Pair]:
    return st.one_of(objects(children), arrays(children), any_ofs(children), all_ofs(children))


@st.composite
def schemas(draw: st.DrawFn) -> Pair:
    """A random supported schema and a strategy for its instances (sometimes behind a $ref)."""
    schema, values = draw(st.recursive(LEAVES, _extend, max_leaves=6))
    if draw(st.booleans()):
        schema = {"$defs": {"main": schema}, "$ref": "#/$defs/main"}
    return schema, values
