"""Parse tool calls out of model output as it streams.

Three wire formats share one engine; a :class:`ToolCallStyle` says how calls are framed:

- ``hermes`` (Hermes, Qwen 2.5/3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (newlines inside the tags are usual), any number of them, possibly after some text.
- ``llama3_json`` (Llama 3.x): the whole output is ``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``; several calls may follow each other (``;``-separated).
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``.

Each call object may use ``arguments`` or ``parameters``; a string value is taken as JSON text.
A call is announced (a :class:`ToolCallDelta` with index, a fresh id and the name) as soon as
its ``name`` is complete; its arguments then stream as fragments of their raw JSON text, so the
fragments add up to the final ``arguments``. Text around calls is content; whitespace between
or after calls is dropped. Text that turns out not to be a call (no ``name``, not an object)
is released as content, so nothing the model wrote is lost.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from llamapy.chat.delta import Delta, ToolCallDelta, new_tool_call_id
from llamapy.chat.json_scan import ObjectScanner
from llamapy.chat.reasoning import held_suffix

_ARGUMENT_KEYS = ("arguments", "parameters")
_CALL_FIRST_KEYS = ("name", "type")


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallStyle:
    """How one model family frames its tool calls."""

    name: str
    #: Text that starts a call (or a list of calls); ``None`` when calls are bare JSON only.
    open_marker: str | None
    #: Text that ends a call (Hermes ``</tool_call>``); optional in the output.
    close_marker: str | None = None
    #: Calls are the elements of a JSON array after the open marker (Mistral).
    array: bool = False
    #: A call may also start with ``{`` at the start of the output or after a call (Llama 3).
    bare_json: bool = False


HERMES = ToolCallStyle(name="hermes", open_marker="<tool_call>", close_marker="</tool_call>")
LLAMA3_JSON = ToolCallStyle(name="llama3_json", open_marker="<|python_tag|>", bare_json=True)
MISTRAL = ToolCallStyle(name="mistral", open_marker="[TOOL_CALLS]", array=True)


class _State(enum.Enum):
    TEXT = "text"  # ordinary content, watching for a call
    OPEN = "open"  # after the open marker, expecting "{" (or "[" for arrays)
    OBJECT = "object"  # inside a call object
    ARRAY_NEXT = "array_next"  # after a call inside an array: "," or "]"
    CLOSE = "close"  # after a call: expecting the close marker


class ToolCallParser:
    """Incremental tool-call parser for one :class:`ToolCallStyle`.

    ``feed`` returns a :class:`Delta` with ``content`` and ``tool_call_deltas``; ``flush`` ends
    the output. ``id_factory`` makes call ids (tests pass a deterministic one).
    """

    def __init__(
        self, style: ToolCallStyle, *, id_factory: Callable[[], str] = new_tool_call_id
    ) -> None:
        self.style = style
        self._new_id = id_factory
        self._state = _State.TEXT
        self._buf = ""
        self._final = False
        self._out = Delta()
        self._num_calls = 0
        # the call being read
        self._scanner = ObjectScanner()
        self._raw_prefix = ""  # marker and whitespace before the object, for the no-call case
        self._bare = False  # the call started without a marker (Llama 3 bare JSON)
        self._deciding = False  # bare JSON whose first key is not known yet
        self._announced = False
        self._sent_arguments = 0
        self._in_array = False
        # content whitespace policy
        self._at_start = True
        self._held_ws = ""
        self._strip_leading = False

    @property
    def num_calls(self) -> int:
        """Calls announced so far."""
        return self._num_calls

    def feed(self, text: str) -> Delta:
        """Consume a chunk of output; return the content and call pieces now decided."""
        if self._final:
            raise RuntimeError("feed() after flush()")
        self._buf += text
        return self._run()

    def flush(self) -> Delta:
        """End of output: release held text; an unfinished call keeps what it streamed."""
        self._final = True
        out = self._run()
        if self._num_calls == 0:
            out.content += self._held_ws
        self._held_ws = ""
        return out

    def _run(self) -> Delta:
        handlers = {
            _State.TEXT: self._text,
            _State.OPEN: self._open,
            _State.OBJECT: self._object,
            _State.ARRAY_NEXT: self._array_next,
            _State.CLOSE: self._close,
        }
        while handlers[self._state]():
            pass
        out, self._out = self._out, Delta()
        return out

    # --- content ---------------------------------------------------------------------------

    def _emit_content(self, text: str) -> None:
        text = self._held_ws + text
        if self._strip_leading:
            text = text.lstrip()
            self._strip_leading = not text
        body = text.rstrip()
        self._held_ws = text[len(body) :]
        self._out.content += body
        if body:
            self._at_start = False

    def _text(self) -> bool:
        if self.style.bare_json and self._at_start:
            stripped = self._buf.lstrip(" \t\r\n;")
            if stripped.startswith("{"):
                self._raw_prefix = self._buf[: len(self._buf) - len(stripped)]
                self._buf = stripped
                self._bare = self._deciding = True
                self._state = _State.OBJECT
                return True
            if not stripped and not self._final:
                return False
            self._at_start = not stripped
        marker = self.style.open_marker
        index = self._buf.find(marker) if marker else -1
        if index >= 0:
            self._emit_content(self._buf[:index])
            self._raw_prefix = marker or ""
            self._buf = self._buf[index + len(self._raw_prefix) :]
            self._state = _State.OPEN
            return True
        keep = 0 if self._final or not marker else held_suffix(self._buf, marker)
        self._emit_content(self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    # --- inside calls ------------------------------------------------------------------------

    def _open(self) -> bool:
        stripped = self._buf.lstrip()
        if not stripped and not self._final:
            return False
        lead = self._buf[: len(self._buf) - len(stripped)]
        if self.style.array and not self._in_array and stripped.startswith("["):
            self._in_array = True
            self._raw_prefix += lead + "["
            self._buf = stripped[1:]
            return True
        if stripped.startswith("{"):
            self._raw_prefix += lead
            self._buf = stripped
            self._state = _State.OBJECT
            return True
        self._release_raw(self._raw_prefix)
        return True

    def _object(self) -> bool:
        scanner = self._scanner
        used = scanner.feed(self._buf, stop_after_key=self._deciding)
        self._buf = self._buf[used:]
        if self._deciding and scanner.last_key is not None:
            if scanner.last_key not in _CALL_FIRST_KEYS:
                self._release_raw(self._raw_prefix + scanner.text)
                return True
            self._deciding = False
        self._progress()
        if scanner.done or scanner.failed or self._final:
            self._end_call()
            return True
        return used > 0 and bool(self._buf)

    def _arguments_so_far(self) -> str:
        scanner = self._scanner
        for key in _ARGUMENT_KEYS:
            span = scanner.spans.get(key)
            if span is None:
                continue
            start, end = span
            if scanner.text[start] in "{[":
                return scanner.text[start : len(scanner.text) if end is None else end]
            decoded = scanner.string_value(key)
            if decoded is not None:
                return decoded
            return scanner.text[start:end] if end is not None else ""
        return "{}" if scanner.done else ""

    def _progress(self) -> None:
        if not self._announced:
            name = self._scanner.string_value("name")
            if name is None or (self._bare and not self._has_arguments_key()):
                return
            self._announced = True
            self._held_ws = ""  # whitespace before a call is dropped
            self._out.tool_call_deltas.append(
                ToolCallDelta(index=self._num_calls, id=self._new_id(), name=name)
            )
        arguments = self._arguments_so_far()
        if len(arguments) > self._sent_arguments:
            fragment = arguments[self._sent_arguments :]
            self._sent_arguments = len(arguments)
            self._out.tool_call_deltas.append(
                ToolCallDelta(index=self._num_calls, arguments=fragment)
            )

    def _has_arguments_key(self) -> bool:
        return any(key in self._scanner.spans for key in _ARGUMENT_KEYS)

    def _end_call(self) -> None:
        announced, failed = self._announced, self._scanner.failed
        if not announced:
            self._release_raw(self._raw_prefix + self._scanner.text)
            return
        self._num_calls += 1
        self._reset_call()
        self._strip_leading = True
        self._at_start = True
        if failed:
            self._in_array = False
            self._state = _State.TEXT
        elif self._in_array:
            self._state = _State.ARRAY_NEXT
        else:
            self._state = _State.CLOSE if self.style.close_marker else _State.TEXT

    def _reset_call(self) -> None:
        self._scanner = ObjectScanner()
        self._raw_prefix = ""
        self._bare = self._deciding = False
        self._announced = False
        self._sent_arguments = 0

    def _release_raw(self, raw: str) -> None:
        """What looked like a call is not one: its text is content."""
        self._emit_content(raw)
        self._at_start = False
        self._reset_call()
        self._in_array = False
        self._state = _State.TEXT

    def _array_next(self) -> bool:
        stripped = self._buf.lstrip()
        if not stripped and not self._final:
            return False
        self._buf = stripped[1:] if stripped[:1] in (",", "]") else stripped
        if stripped.startswith(","):
            self._state = _State.OPEN
            return True
        self._in_array = False
        self._state = _State.TEXT
        return True

    def _close(self) -> bool:
        marker = self.style.close_marker or ""
        stripped = self._buf.lstrip()
        if stripped.startswith(marker):
            self._buf = stripped[len(marker) :]
        elif not self._final and marker.startswith(stripped):
            return False
        self._state = _State.TEXT
        return True
