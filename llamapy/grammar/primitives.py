r"""The fixed GBNF rules every JSON grammar draws on: whitespace, strings, numbers, any value.

Bounds are deliberate. Whitespace between tokens is at most two characters (``[ \t\n]{0,2}``),
so a small model cannot stall emitting spaces; numbers have at most 16 integer digits, 20
fraction digits and 3 exponent digits (every float ``json.dumps`` writes fits). A string
character is one unescaped character or one escape, where a ``\u`` escape is a non-surrogate
code unit or a surrogate *pair*: so ``char{m,n}`` counts characters exactly as JSON Schema's
``minLength``/``maxLength`` do, and lone surrogates cannot be produced.

Bodies are functions of the names of the rules they depend on, because the
:class:`~llamapy.grammar.gbnf.GrammarBuilder` may rename a rule to avoid a user's name.
"""

from __future__ import annotations

from collections.abc import Callable

from llamapy.grammar.gbnf import GrammarBuilder

_HEX = "[0-9a-fA-F]"
_INT_PART = '("0" | [1-9] [0-9]{0,15})'
_FRACTION = '("." [0-9]{1,20})?'
_EXPONENT = "([eE] [-+]? [0-9]{1,3})?"
_HOUR = '([01] [0-9] | "2" [0-3])'
_MINUTE = "[0-5] [0-9]"
_DAY_31 = '("0" [1-9] | [12] [0-9] | "3" [01])'
_DAY_30 = '("0" [1-9] | [12] [0-9] | "30")'
_DAY_28 = '("0" [1-9] | "1" [0-9] | "2" [0-8])'
_YEAR = '("000" [1-9] | "00" [1-9] [0-9] | "0" [1-9] [0-9]{2} | [1-9] [0-9]{3})'
_LEAP_YEAR = (
    '([0-9]{2} ("0" [48] | [2468] [048] | [13579] [26])'
    ' | ("0" [48] | [2468] [048] | [13579] [26]) "00")'
)

_Body = Callable[..., str]

#: name -> (dependencies, body built from the dependencies' rule names)
PRIMITIVES: dict[str, tuple[tuple[str, ...], _Body]] = {
    "ws": ((), lambda: "[ \\t\\n]{0,2}"),
    "char": (
        (),
        lambda: (
            '[^"\\\\\\x00-\\x1F] | "\\\\" ["\\\\/bfnrt]'
            f' | "\\\\u" ([0-9a-cA-Ce-fE-F] {_HEX}{{3}} | [dD] [0-7] {_HEX}{{2}})'
            f' | "\\\\u" [dD] [89abAB] {_HEX}{{2}} "\\\\u" [dD] [c-fC-F] {_HEX}{{2}}'
        ),
    ),
    "string": (("char",), lambda char: f'"\\"" {char}* "\\""'),
    "integer": ((), lambda: f'"-"? {_INT_PART}'),
    "number": ((), lambda: f'"-"? {_INT_PART} {_FRACTION} {_EXPONENT}'),
    "nonnegative-number": ((), lambda: f"{_INT_PART} {_FRACTION} {_EXPONENT}"),
    "boolean": ((), lambda: '"true" | "false"'),
    "null": ((), lambda: '"null"'),
    "value": (
        ("object", "array", "string", "number", "boolean", "null"),
        lambda *names: " | ".join(names),
    ),
    "member": (("string", "ws", "value"), lambda s, ws, v: f'{s} {ws} ":" {ws} {v}'),
    "object": (
        ("member", "ws"),
        lambda m, ws: f'"{{" {ws} ({m} ({ws} "," {ws} {m})* {ws})? "}}"',
    ),
    "array": (
        ("value", "ws"),
        lambda v, ws: f'"[" {ws} ({v} ({ws} "," {ws} {v})* {ws})? "]"',
    ),
    "date-body": (
        (),
        lambda: (
            f'{_YEAR} "-" (("0" [13578] | "1" [02]) "-" {_DAY_31}'
            f' | ("0" [469] | "11") "-" {_DAY_30} | "02-" {_DAY_28})'
            f' | {_LEAP_YEAR} "-02-29"'
        ),
    ),
    "time-body": (
        (),
        lambda: (
            f'{_HOUR} ":" {_MINUTE} ":" {_MINUTE} ("." [0-9]{{1,9}})?'
            f' ([zZ] | [+-] {_HOUR} ":" {_MINUTE})'
        ),
    ),
    "date": (("date-body",), lambda d: f'"\\"" {d} "\\""'),
    "time": (("time-body",), lambda t: f'"\\"" {t} "\\""'),
    "date-time": (("date-body", "time-body"), lambda d, t: f'"\\"" {d} [tT] {t} "\\""'),
    "uuid": (
        (),
        lambda: (
            f'"\\"" {_HEX}{{8}} "-" {_HEX}{{4}} "-" {_HEX}{{4}} "-" {_HEX}{{4}}'
            f' "-" {_HEX}{{12}} "\\""'
        ),
    ),
}

#: JSON Schema ``format`` values we can generate, and the primitive for each.
STRING_FORMATS = {"date": "date", "time": "time", "date-time": "date-time", "uuid": "uuid"}


class Primitives:
    """Adds primitive rules to a builder on first use; returns their (possibly renamed) names."""

    def __init__(self, builder: GrammarBuilder) -> None:
        self._builder = builder
        self._names: dict[str, str] = {}

    def __call__(self, key: str) -> str:
        """The rule name of primitive ``key``, adding it and its dependencies if needed."""
        name = self._names.get(key)
        if name is not None:
            return name
        depends, body = PRIMITIVES[key]
        name = self._builder.reserve(key)
        self._names[key] = name  # before the dependencies: value/object/array are recursive
        self._builder.define(name, body(*(self(dep) for dep in depends)))
        return name
