"""GBNF bodies for JSON arrays and objects, given the rules of their elements.

Separators are ``ws "," ws`` and brackets take ``ws`` inside, where ``ws`` is the bounded
whitespace rule. Object members come in a fixed order; optional members are each present or
absent, which takes one rule per optional member ("a non-empty run of the remaining ones").
"""

from __future__ import annotations

from llamapy.grammar.gbnf import GrammarBuilder, alternatives, literal, repeat, sequence


def _minus_one(value: int | None) -> int | None:
    return None if value is None else value - 1


def array_body(
    ws: str, fixed: list[str], extra: str | None, extra_low: int, extra_high: int | None
) -> str:
    """``[`` the ``fixed`` items, then ``extra_low..extra_high`` ``extra`` items ``]``."""
    sep = sequence(ws, literal(","), ws)
    open_, close = literal("["), literal("]")
    if fixed:
        parts = [fixed[0], *(sequence(sep, item) for item in fixed[1:])]
        if extra is not None and extra_high != 0:
            parts.append(repeat(sequence(sep, extra), extra_low, extra_high))
        return sequence(open_, ws, " ".join(parts), ws, close)
    if extra is None or extra_high == 0:
        return sequence(open_, ws, close)
    more = repeat(sequence(sep, extra), max(extra_low - 1, 0), _minus_one(extra_high))
    run = sequence(extra, more)
    if extra_low == 0:
        return sequence(open_, ws, repeat(sequence(run, ws), 0, 1), close)
    return sequence(open_, ws, run, ws, close)


def object_body(
    builder: GrammarBuilder,
    ws: str,
    hint: str,
    *,
    required: list[str],
    optional: list[str],
    extra: str | None,
) -> str:
    """``{`` required members, then each optional one present or absent, then extras ``}``."""
    sep = sequence(ws, literal(","), ws)
    tail = None  # a rule for a non-empty run of the remaining optional members and extras
    if extra is not None:
        tail = builder.add(f"{hint}-extras", sequence(extra, repeat(sequence(sep, extra), 0, None)))
    for index in range(len(optional) - 1, -1, -1):
        member = optional[index]
        if tail is None:
            tail = member
            continue
        body = alternatives(sequence(member, repeat(sequence(sep, tail), 0, 1)), tail)
        tail = builder.add(f"{hint}-tail-{index}", body)
    open_, close = literal("{"), literal("}")
    if required:
        items = [required[0], *(sequence(sep, member) for member in required[1:])]
        if tail is not None:
            items.append(repeat(sequence(sep, tail), 0, 1))
        return sequence(open_, ws, " ".join(items), ws, close)
    if tail is None:
        return sequence(open_, ws, close)
    return sequence(open_, ws, repeat(sequence(tail, ws), 0, 1), close)
