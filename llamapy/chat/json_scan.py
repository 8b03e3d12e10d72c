"""An incremental scanner for one JSON object, enough to stream a tool call out of it.

It does not validate nested values; it follows strings, nesting and the object's own top-level
``"key": value`` structure, so that while text streams in we know each top-level key and where
its value starts and (once complete) ends. That is what a tool-call parser needs to announce a
call as soon as its ``name`` is complete and then stream the ``arguments`` text.
"""

from __future__ import annotations

import enum
import json

_WS = " \t\r\n"


class _Phase(enum.Enum):
    OPEN = "open"  # expecting "{"
    FIRST_KEY = "first_key"  # expecting a key or "}"
    NEXT_KEY = "next_key"  # expecting a key after ","
    KEY = "key"  # inside a key
    COLON = "colon"
    VALUE = "value"  # expecting a value
    NESTED = "nested"  # inside an object/array value
    STRING = "string"  # inside a string value
    SCALAR = "scalar"  # inside a number or literal value
    AFTER_VALUE = "after_value"  # expecting "," or "}"
    DONE = "done"
    FAILED = "failed"


class ObjectScanner:
    """Scans one JSON object fed in pieces.

    ``text`` is everything consumed (it starts at the ``{``); ``spans`` maps each top-level key
    to ``(start, end)`` offsets of its value in ``text`` (``end`` is ``None`` while the value is
    incomplete). ``done`` means the closing ``}`` was consumed; ``failed`` that the text is not
    a JSON object (the offending character is not consumed).
    """

    def __init__(self) -> None:
        self.text = ""
        self.spans: dict[str, tuple[int, int | None]] = {}
        self._phase = _Phase.OPEN
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._key_start = 0
        self._key = ""
        self._key_completed = False
        self._last_key: str | None = None

    @property
    def done(self) -> bool:
        """True once the object is complete."""
        return self._phase is _Phase.DONE

    @property
    def failed(self) -> bool:
        """True once the text turned out not to be a JSON object."""
        return self._phase is _Phase.FAILED

    @property
    def last_key(self) -> str | None:
        """The most recent complete top-level key, if any."""
        return self._last_key

    def feed(self, text: str, *, stop_after_key: bool = False) -> int:
        """Consume ``text`` up to the end of the object; return how many characters were used.

        With ``stop_after_key``, return right after a top-level key is complete, so a caller
        can decide on the first key before consuming more.
        """
        for offset, char in enumerate(text):
            if self._phase in (_Phase.DONE, _Phase.FAILED):
                return offset
            self._step(char, len(self.text))
            if self._failed():
                return offset
            self.text += char
            if self._key_completed:
                self._key_completed = False
                if stop_after_key:
                    return offset + 1
        return len(text)

    def value_text(self, key: str) -> str | None:
        """Raw text of a complete value, or ``None`` if absent or incomplete."""
        span = self.spans.get(key)
        if span is None or span[1] is None:
            return None
        return self.text[span[0] : span[1]]

    def string_value(self, key: str) -> str | None:
        """A complete string value, decoded; ``None`` if absent, incomplete or not a string."""
        raw = self.value_text(key)
        if raw is None or not raw.startswith('"'):
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, str) else None

    # --- the state machine ------------------------------------------------------------------

    def _failed(self) -> bool:
        return self._phase is _Phase.FAILED

    def _step(self, char: str, pos: int) -> None:
        if self._in_string:
            self._string_char(char, pos)
            return
        _HANDLERS[self._phase](self, char, pos)

    def _string_char(self, char: str, pos: int) -> None:
        if char < " ":  # a raw control character: JSON strings must escape it
            self._in_string = False
            self._phase = _Phase.FAILED
        elif self._escape:
            self._escape = False
        elif char == "\\":
            self._escape = True
        elif char == '"':
            self._in_string = False
            if self._phase is _Phase.KEY:
                try:
                    self._key = json.loads(self.text[self._key_start : pos] + '"')
                except ValueError:  # a bad escape such as "\\x"
                    self._phase = _Phase.FAILED
                    return
                self._key_completed = True
                self._last_key = self._key
                self._phase = _Phase.COLON
            elif self._phase is _Phase.STRING:
                self._close_value(pos + 1)

    def _open(self, char: str, pos: int) -> None:
        if char in _WS:
            return
        if char != "{":
            self._phase = _Phase.FAILED
            return
        self._depth = 1
        self._phase = _Phase.FIRST_KEY

    def _first_key(self, char: str, pos: int) -> None:
        if char == "}":
            self._phase = _Phase.DONE
            return
        self._key_char(char, pos)

    def _key_char(self, char: str, pos: int) -> None:
        if char in _WS:
            return
        if char != '"':
            self._phase = _Phase.FAILED
            return
        self._in_string = True
        self._key_start = pos
        self._phase = _Phase.KEY

    def _colon(self, char: str, pos: int) -> None:
        if char in _WS:
            return
        self._phase = _Phase.VALUE if char == ":" else _Phase.FAILED

    def _value(self, char: str, pos: int) -> None:
        if char in _WS:
            return
        if char in ",}]:":
            self._phase = _Phase.FAILED
            return
        self.spans[self._key] = (pos, None)
        if char in "{[":
            self._depth = 2
            self._phase = _Phase.NESTED
        elif char == '"':
            self._in_string = True
            self._phase = _Phase.STRING
        else:
            self._phase = _Phase.SCALAR

    def _nested(self, char: str, pos: int) -> None:
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            if self._depth == 1:
                self._close_value(pos + 1)

    def _scalar(self, char: str, pos: int) -> None:
        if char in _WS:
            self._close_value(pos)
        elif char in ",}":
            self._close_value(pos)
            self._after_value(char, pos)
        elif char in '{["]:':
            self._phase = _Phase.FAILED

    def _after_value(self, char: str, pos: int) -> None:
        if char in _WS:
            return
        if char == ",":
            self._phase = _Phase.NEXT_KEY
        elif char == "}":
            self._depth = 0
            self._phase = _Phase.DONE
        else:
            self._phase = _Phase.FAILED

    def _close_value(self, end: int) -> None:
        start, _ = self.spans[self._key]
        self.spans[self._key] = (start, end)
        self._phase = _Phase.AFTER_VALUE


_HANDLERS = {
    _Phase.OPEN: ObjectScanner._open,
    _Phase.FIRST_KEY: ObjectScanner._first_key,
    _Phase.NEXT_KEY: ObjectScanner._key_char,
    _Phase.COLON: ObjectScanner._colon,
    _Phase.VALUE: ObjectScanner._value,
    _Phase.NESTED: ObjectScanner._nested,
    _Phase.SCALAR: ObjectScanner._scalar,
    _Phase.AFTER_VALUE: ObjectScanner._after_value,
}
