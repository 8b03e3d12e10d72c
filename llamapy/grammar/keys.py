r"""Object keys for ``additionalProperties``: any string except the declared property names.

An extra key must not repeat a declared one (a duplicate key would let the last value win and
escape the property's schema). Excluding a finite set of strings is done with a trie: at each
node the key may end (unless a declared name ends there), continue along a declared name, or
take any other character and then anything.

For this to be exact every key must have a single spelling, so extra keys use a restricted
alphabet: any character except ``"``, ``\`` and controls, written raw, plus the two-character
escapes ``\" \\ \b \f \n \r \t`` (no ``\uXXXX``, no ``\/``). That is how
``json.dumps(..., ensure_ascii=False)`` writes keys, apart from rare control characters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llamapy.grammar.gbnf import GrammarBuilder, alternatives, char_class, literal, sequence

_SHORT_ESCAPES = '"\\bfnrt'
_RAW_EXCLUDED = ('"', "\\")
_CONTROL_RANGE = (("\x00", "\x1f"),)


@dataclass
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    terminal: bool = False


def key_units(key: str) -> list[str] | None:
    """The spelling of ``key`` as alphabet units, or ``None`` if it has no spelling."""
    spelled = json.dumps(key, ensure_ascii=False)[1:-1]
    units = []
    index = 0
    while index < len(spelled):
        if spelled[index] == "\\":
            escape = spelled[index : index + 2]
            if escape[1] not in _SHORT_ESCAPES:
                return None  # a \uXXXX control character: not in the extra-key alphabet
            units.append(escape)
            index += 2
        else:
            units.append(spelled[index])
            index += 1
    return units


def _unit_rule(builder: GrammarBuilder) -> str:
    raw = char_class("".join(_RAW_EXCLUDED), ranges=_CONTROL_RANGE, negated=True)
    escaped = sequence(literal("\\"), char_class(_SHORT_ESCAPES))
    return builder.add("key-char", alternatives(raw, escaped))


def _other_unit(children: dict[str, _Node]) -> str:
    """Any unit that is not one of ``children``'s."""
    raws = "".join(unit for unit in children if len(unit) == 1)
    escapes = "".join(unit[1] for unit in children if len(unit) == 2)
    options = [char_class("".join(_RAW_EXCLUDED) + raws, ranges=_CONTROL_RANGE, negated=True)]
    remaining = "".join(c for c in _SHORT_ESCAPES if c not in escapes)
    if remaining:
        options.append(sequence(literal("\\"), char_class(remaining)))
    return alternatives(*options)


def _node_rule(builder: GrammarBuilder, node: _Node, unit_rule: str, hint: str) -> str:
    close = literal('"')
    options = [] if node.terminal else [close]
    for index, (unit, child) in enumerate(sorted(node.children.items())):
        child_rule = _node_rule(builder, child, unit_rule, f"{hint}-{index}")
        options.append(sequence(literal(unit), child_rule))
    options.append(sequence(_other_unit(node.children), f"{unit_rule}*", close))
    return builder.add(hint, alternatives(*options))


def excluded_key_rule(builder: GrammarBuilder, declared: list[str], hint: str) -> str:
    """Rule for a quoted JSON key that is none of ``declared``."""
    unit_rule = _unit_rule(builder)
    if not declared:
        return builder.add(hint, sequence(literal('"'), f"{unit_rule}*", literal('"')))
    root = _Node()
    for key in declared:
        units = key_units(key)
        if units is None:
            continue
        node = root
        for unit in units:
            node = node.children.setdefault(unit, _Node())
        node.terminal = True
    rest = _node_rule(builder, root, unit_rule, f"{hint}-rest")
    return builder.add(hint, sequence(literal('"'), rest))
