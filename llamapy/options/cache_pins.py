"""The ``cache_pins`` request option: prompt prefixes to keep in the prompt cache for a time.

A pin is ``(length, ttl_s)``: keep the prompt's first ``length`` tokens cached for ``ttl_s``
seconds (see :mod:`llamapy.engine.cache.pin_table` for what the engine does with it). A request
carries at most :data:`MAX_CACHE_PINS` of them (Anthropic allows four cache breakpoints); a
time to live is at most :data:`MAX_PIN_TTL_S` (Responses' longest retention, 24 h).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from llamapy.options._spec import check, is_finite, is_int

__all__ = ["MAX_CACHE_PINS", "MAX_PIN_TTL_S", "check_cache_pins"]

#: The most pins one request may carry.
MAX_CACHE_PINS = 4
#: The longest time to live of a pin, in seconds.
MAX_PIN_TTL_S = 86_400.0
#: The longest pinned prefix, in tokens (no context is larger).
MAX_PIN_TOKENS = 1 << 24

_WHAT = (f"must be a sequence of at most {MAX_CACHE_PINS} (length, ttl_s) pairs: length an "
         f"integer in [1, {MAX_PIN_TOKENS}], ttl_s a number of seconds in (0, "
         f"{MAX_PIN_TTL_S:g}]")


def _pin(item: object) -> tuple[int, float]:
    check(isinstance(item, Sequence) and not isinstance(item, str | bytes) and len(item) == 2,
          "cache_pins", _WHAT)
    pair = cast("Sequence[object]", item)
    length, ttl = pair[0], pair[1]
    check(is_int(length) and 1 <= cast("int", length) <= MAX_PIN_TOKENS, "cache_pins", _WHAT)
    check(is_finite(ttl) and 0 < cast("float", ttl) <= MAX_PIN_TTL_S, "cache_pins", _WHAT)
    return cast("int", length), float(cast("float", ttl))


def check_cache_pins(value: object) -> tuple[tuple[int, float], ...]:
    """``value`` as a tuple of ``(length, ttl_s)`` pins (``InvalidOptionError`` otherwise)."""
    check(isinstance(value, Sequence) and not isinstance(value, str | bytes), "cache_pins",
          _WHAT)
    items = list(cast("Sequence[object]", value))
    check(len(items) <= MAX_CACHE_PINS, "cache_pins", _WHAT)
    return tuple(_pin(item) for item in items)
