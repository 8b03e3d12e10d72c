"""GBNF for the decimal integers in a closed range, written the way JSON writes them.

The construction works digit by digit: the numbers with ``n`` digits between ``low`` and
``high`` are "first digit of ``low``, then anything at least the rest of ``low``", "a first
digit strictly between, then any ``n - 1`` digits", and "first digit of ``high``, then anything
at most the rest of ``high``", recursively. Numbers of different lengths are handled length by
length; negative numbers are ``-`` followed by a range of magnitudes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from llamapy.grammar.gbnf import alternatives, char_class, literal, repeat, sequence

#: Bound used for a missing side, so that an unbounded integer still has at most 16 digits.
DEFAULT_MAGNITUDE = 10**16 - 1


def _digit_class(low: int, high: int) -> str:
    if low == high:
        return literal(str(low))
    return char_class(ranges=((str(low), str(high)),))


def _fixed_width(low: str, high: str) -> str:
    """Digit strings of the same width between ``low`` and ``high`` (leading zeros allowed)."""
    if not low:
        return ""
    if low == high:
        return literal(low)
    if low[0] == high[0]:
        return sequence(literal(low[0]), _fixed_width(low[1:], high[1:]))
    width = len(low) - 1
    rest_low = "0" * width
    rest_high = "9" * width
    lead_low, lead_high = int(low[0]), int(high[0])
    options = []
    if low[1:] == rest_low:
        lead_low -= 1  # the whole block of low[0] is covered by the middle part below
    else:
        options.append(sequence(literal(low[0]), _fixed_width(low[1:], rest_high)))
    tail_full = high[1:] == rest_high
    middle_low, middle_high = lead_low + 1, lead_high - (0 if tail_full else 1)
    if middle_low <= middle_high:
        digits = repeat(char_class(ranges=(("0", "9"),)), width, width) if width else ""
        options.append(sequence(_digit_class(middle_low, middle_high), digits))
    if not tail_full:
        options.append(sequence(literal(high[0]), _fixed_width(rest_low, high[1:])))
    return alternatives(*options)


def _magnitudes(low: int, high: int) -> str:
    """Non-negative integers in ``[low, high]`` without leading zeros."""
    options = []
    for width in range(len(str(low)), len(str(high)) + 1):
        start = max(low, 10 ** (width - 1) if width > 1 else 0)
        end = min(high, 10**width - 1)
        if start <= end:
            options.append(_fixed_width(str(start), str(end)))
    return alternatives(*options)


def integer_range(low: int | None, high: int | None) -> str:
    """GBNF body for JSON integers ``n`` with ``low <= n <= high`` (``None``: open side)."""
    if low is None:
        low = -max(DEFAULT_MAGNITUDE, abs(high or 0))
    if high is None:
        high = max(DEFAULT_MAGNITUDE, abs(low))
    options = []
    if low < 0:
        negative_high = -1 if high >= 0 else high
        options.append(sequence(literal("-"), _magnitudes(-negative_high, -low)))
    if high >= 0:
        options.append(_magnitudes(max(low, 0), high))
    return alternatives(*options)


def _integer_bound(value: float, *, strict: bool, upper: bool) -> int:
    if upper:
        return math.ceil(value) - 1 if strict else math.floor(value)
    return math.floor(value) + 1 if strict else math.ceil(value)


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str, *, upper: bool) -> int | None:
    candidates = []
    value = schema.get(inclusive)
    flag = schema.get(exclusive)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        strict = flag is True  # draft 4: exclusiveMinimum/Maximum is a boolean modifier
        candidates.append(_integer_bound(value, strict=strict, upper=upper))
    if isinstance(flag, (int, float)) and not isinstance(flag, bool):
        candidates.append(_integer_bound(flag, strict=True, upper=upper))
    if not candidates:
        return None
    return min(candidates) if upper else max(candidates)


def integer_bounds(schema: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The integer range a schema's ``minimum``/``maximum`` (and exclusive forms) allow."""
    low = _bound(schema, "minimum", "exclusiveMinimum", upper=False)
    high = _bound(schema, "maximum", "exclusiveMaximum", upper=True)
    return low, high
