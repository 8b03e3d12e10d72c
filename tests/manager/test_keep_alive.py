"""keep_alive parsing (Ollama's semantics)."""

from __future__ import annotations

import math

import pytest

from llamapy.errors import InvalidOptionError
from llamapy.server import parse_keep_alive


@pytest.mark.parametrize(("value", "seconds"), [
    (0, 0.0), ("0", 0.0), (30, 30.0), ("30", 30.0), ("90s", 90.0), ("5m", 300.0),
    ("1h", 3600.0), ("250ms", 0.25), (1.5, 1.5), (-1, math.inf), ("-1", math.inf),
    ("-5m", math.inf),
])
def test_durations(value: object, seconds: float) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "", None, True, float("nan"), [1]])
def test_bad_values_raise(value: object) -> None:
    with pytest.raises(InvalidOptionError):
        parse_keep_alive(value)
