"""Writing GBNF, llama.cpp's grammar format, and collecting its rules.

GBNF in one paragraph: a grammar is lines ``name ::= body``; rule names are letters, digits and
``-``; ``root`` is where matching starts. A body is alternatives (``|``) of sequences of
``"literals"`` (escapes ``\\n \\t \\r \\\\ \\" \\xHH \\uHHHH \\UHHHHHHHH``), character classes
``[a-z]`` / ``[^"\\\\]`` (same escapes, plus ``\\[ \\] \\-``), rule references and ``( groups )``,
each optionally repeated with ``*``, ``+``, ``?`` or ``{m}``, ``{m,}``, ``{m,n}``.

:class:`GrammarBuilder` hands out unique rule names, reuses a rule whose body already exists, and
lets a rule be referenced before it is defined (for recursive schemas).
"""

from __future__ import annotations

import re

from llamapy.errors import GrammarError

#: llama.cpp refuses repetition counts above 2000; we stay well below.
MAX_REPETITION = 1000

_LITERAL_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", '"': '\\"'}
_CLASS_ESCAPES = {**_LITERAL_ESCAPES, "[": "\\[", "]": "\\]", "-": "\\-", "^": "\\^"}


def _escape_char(char: str, table: dict[str, str]) -> str:
    if char in table:
        return table[char]
    code = ord(char)
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02X}"
    if 0x80 <= code <= 0xFFFF:
        return f"\\u{code:04X}"
    if code > 0xFFFF:
        return f"\\U{code:08X}"
    return char


def literal(text: str) -> str:
    """A GBNF string literal matching ``text`` exactly."""
    return '"' + "".join(_escape_char(c, _LITERAL_ESCAPES) for c in text) + '"'


def class_char(char: str) -> str:
    """One character written for use inside ``[...]``."""
    return _escape_char(char, _CLASS_ESCAPES)


def char_class(
    chars: str = "", *, ranges: tuple[tuple[str, str], ...] = (), negated: bool = False
) -> str:
    """A character class of single ``chars`` and inclusive ``ranges``."""
    body = "".join(class_char(c) for c in chars)
    body += "".join(f"{class_char(lo)}-{class_char(hi)}" for lo, hi in ranges)
    return "[" + ("^" if negated else "") + body + "]"


def group(expr: str) -> str:
    """``expr`` made safe to repeat or to put in a sequence."""
    if _is_atom(expr):
        return expr
    return f"({expr})"


def _is_atom(expr: str) -> bool:
    if re.fullmatch(r"[a-zA-Z0-9-]+", expr):
        return True
    if re.fullmatch(r'"(?:[^"\\]|\\.)*"', expr):
        return True
    if re.fullmatch(r"\[(?:[^\]\\]|\\.)*\]", expr):
        return True
    return expr.startswith("(") and _closing_paren(expr) == len(expr) - 1


def _closing_paren(expr: str) -> int:
    depth, quote, index = 0, None, 0
    while index < len(expr):
        char = expr[index]
        if char == "\\":
            index += 2
            continue
        if quote:
            quote = None if char == quote else quote
        elif char in '"[':
            quote = '"' if char == '"' else "]"
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    return -1


def sequence(*parts: str) -> str:
    """Parts in order (each grouped where needed); empty parts are skipped."""
    items = [group(part) if " | " in part else part for part in parts if part]
    return " ".join(items) if items else '""'


def alternatives(*options: str) -> str:
    """Any one of ``options`` (duplicates dropped, order kept)."""
    unique = list(dict.fromkeys(options))
    if not unique:
        raise GrammarError("no alternatives: the schema cannot be satisfied")
    return " | ".join(unique)


def repeat(expr: str, low: int, high: int | None) -> str:
    """``expr`` repeated ``low`` to ``high`` times (``None``: unbounded)."""
    if high is not None and high < low:
        raise GrammarError(f"repetition range {low}..{high} is empty")
    if low > MAX_REPETITION:
        raise GrammarError(f"repetition count {low} exceeds {MAX_REPETITION}")
    if high is not None:
        high = min(high, MAX_REPETITION)
    atom = group(expr)
    if high is None:
        return {0: f"{atom}*", 1: f"{atom}+"}.get(low, f"{atom}{{{low},}}")
    if (low, high) == (0, 0):
        return '""'
    if (low, high) == (1, 1):
        return expr
    if (low, high) == (0, 1):
        return f"{atom}?"
    if low == high:
        return f"{atom}{{{low}}}"
    return f"{atom}{{{low},{high}}}"


def rule_name(hint: str) -> str:
    """A valid rule name derived from ``hint``."""
    name = re.sub(r"[^a-zA-Z0-9-]+", "-", hint).strip("-")
    return name or "rule"


class GrammarBuilder:
    """Collects named rules and renders the grammar text."""

    def __init__(self) -> None:
        self._rules: dict[str, str | None] = {}
        self._by_body: dict[str, str] = {}

    def reserve(self, hint: str) -> str:
        """A fresh rule name, to be given a body with :meth:`define`."""
        base = rule_name(hint)
        name, number = base, 1
        while name in self._rules:
            number += 1
            name = f"{base}-{number}"
        self._rules[name] = None
        return name

    def define(self, name: str, body: str) -> None:
        """Set the body of a reserved rule."""
        if self._rules.get(name, "") is not None:
            raise GrammarError(f"rule {name!r} is not reserved or already defined")
        self._rules[name] = body
        self._by_body.setdefault(body, name)

    def add(self, hint: str, body: str) -> str:
        """A rule with ``body``: an existing one with the same body, or a new one."""
        existing = self._by_body.get(body)
        if existing is not None:
            return existing
        name = self.reserve(hint)
        self.define(name, body)
        return name

    def has(self, name: str) -> bool:
        """True if ``name`` is reserved or defined."""
        return name in self._rules

    def render(self) -> str:
        """The grammar text, ``root`` first; every reserved rule must be defined."""
        if "root" not in self._rules:
            raise GrammarError("grammar has no root rule")
        lines = []
        for name in sorted(self._rules, key=lambda n: (n != "root", n)):
            body = self._rules[name]
            if body is None:
                raise GrammarError(f"rule {name!r} was referenced but never defined")
            lines.append(f"{name} ::= {body}")
        return "\n".join(lines) + "\n"
