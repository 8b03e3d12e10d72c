"""Chat through llama.cpp's own chat layer: templates per model, and output read as deltas.

:func:`model_templates` gives a loaded model's :class:`~llamapy.server.chat_format.ChatTemplates`
(its own template or an override; built once per model and source). :class:`ChatOutput` reads
one generation with the parser the layer made for its request and turns each parse's
differences into the :class:`~llamapy.chat.delta.Delta` every API streams: content, reasoning,
and tool calls whose header (id and name) goes out once, when the call's arguments start (or
the generation ends), as llama-server streams them. A call the model opened and never finished
is a :class:`~llamapy.errors.ChatParseError` when the generation ends, never text in the
content.

:data:`HERMES_TOOLS_TEMPLATE` is the template whose format stands in for a model template that
knows no tools: its calls are Hermes JSON in ``<tool_call>`` tags, the framing
:func:`~llamapy.chat.tool_prompt.tool_instructions` teaches.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from llamapy.chat.delta import Delta, MessageBuilder, ParsedMessage, ToolCallDelta, new_tool_call_id
from llamapy.errors import ChatParseError
from llamapy.server.chat_format import (
    ChatDiff,
    ChatMessage,
    ChatParams,
    ChatStream,
    ChatTemplates,
)

__all__ = ["HERMES_TOOLS_TEMPLATE", "ChatOutput", "model_templates", "source_templates"]

log = logging.getLogger("llamapy.chat")

#: ChatML with tools presented in the system turn and calls in ``<tool_call>`` tags.
HERMES_TOOLS_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{ '# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{ '\\n' + (tool | tojson) }}"
    "{%- endfor %}{{ '\\n</tools>\\n\\nFor each function call, return a json object with '"
    "'function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    "'{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>'"
    "'<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{ '<|im_start|>assistant' }}"
    "{%- if message.content %}{{ '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}{%- set fn = call.function or call %}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}"
    "{%- if fn.arguments is string %}{{ fn.arguments }}{%- else %}{{ fn.arguments | tojson }}"
    "{%- endif %}{{ '}\\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response>'"
    "'<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

_lock = threading.Lock()
_by_model: weakref.WeakKeyDictionary[Any, dict[str, ChatTemplates]] = (
    weakref.WeakKeyDictionary())
_by_source: dict[str, ChatTemplates] = {}


def model_templates(model: Any, source: str | None = None) -> ChatTemplates:
    """The chat templates of loaded ``model`` (a :class:`~llamapy._native.model.Model`): its
    own, or ``source`` with the model's BOS/EOS tokens; built once per model and source."""
    with _lock:
        per_model = _by_model.setdefault(model, {})
        key = source or ""
        if key not in per_model:
            per_model[key] = _templates_of(model, key)
        return per_model[key]


def _templates_of(model: Any, source: str) -> ChatTemplates:
    """A native model lends its own templates and tokens; a stand-in (the fake backend's
    model) its template's source and its tokens' text."""
    if hasattr(model, "ptr"):
        return ChatTemplates(model, source)
    own = source or model.chat_template() or ""
    return ChatTemplates(None, own or "chatml", bos=_text(model, model.bos),
                         eos=_text(model, model.eos))


def _text(model: Any, token: int) -> str:
    return str(model.token_text(token)) if token >= 0 else ""


def source_templates(source: str) -> ChatTemplates:
    """Templates of ``source`` alone (no model; a check of an override, a stand-in format)."""
    with _lock:
        if source not in _by_source:
            if len(_by_source) >= 32:
                _by_source.pop(next(iter(_by_source))).close()
            _by_source[source] = ChatTemplates(None, source)
        return _by_source[source]


class ChatOutput:
    """One generation read with the parser of ``params`` (see the module): :meth:`feed` for
    each piece of text, :meth:`flush` at the end, :meth:`finish` for the whole message.

    ``reasoning_format`` is llama-server's (``none`` leaves reasoning in the content);
    ``tools`` says whether calls are read; ``continuation`` that the prompt ends inside the
    assistant's own message (its prefill is not output).
    """

    def __init__(self, params: ChatParams, *, reasoning_format: str, tools: bool,
                 continuation: bool = False,
                 id_factory: Callable[[], str] = new_tool_call_id) -> None:
        self._stream = ChatStream({
            "format": params.format, "parser": params.parser,
            "generation_prompt": params.generation_prompt,
            "reasoning_format": reasoning_format, "parse_tool_calls": tools,
            "is_continuation": continuation})
        self._new_id = id_factory
        self._tools = tools
        self._openers = tuple(t.value for t in params.triggers
                              if t.kind in ("word", "token") and t.value) if tools else ()
        self._text: list[str] = []
        self._emitted = ""  # the content sent so far
        if continuation:  # the prompt's own assistant text is no output
            self._emitted = self._stream.feed("")[1].content.lstrip("\r\n")
        self._calls: list[list[Any]] = []  # [id, name, header sent]
        self._builder = MessageBuilder()
        self._flushed = False

    def feed(self, text: str) -> Delta:
        """The delta that ``text`` (the next piece of output) adds."""
        if self._flushed:
            raise RuntimeError("feed() after flush()")
        if not text:
            return Delta()
        self._text.append(text)
        diffs, message = self._stream.feed(text)
        return self._record(self._delta(diffs, message.content, final=False))

    def flush(self, *, truncated: bool = False) -> Delta:
        """The generation ended: the last delta. A call it left unfinished raises
        ``ChatParseError``, unless it was ``truncated`` (its token budget ran out: the client
        sees that finish reason, and the call as far as it got)."""
        if self._flushed:
            return Delta()
        self._flushed = True
        try:
            diffs, content = self._last_diffs(truncated)
        finally:
            self._stream.close()
        return self._record(self._delta(diffs, content, final=True))

    def _last_diffs(self, truncated: bool) -> tuple[list[ChatDiff], str]:
        """The final parse's differences and content; an output that does not parse whole
        (cut off, or without tools) is read as far as it got (a partial parse). Text that no
        call began and the parse held back is content, never dropped."""
        try:
            diffs, message = self._stream.feed("", final=True)
            if not truncated:
                self._check_calls(message)
        except ChatParseError:
            if not truncated and self._tools:
                raise
            diffs, message = self._stream.feed("", final=False)
        content = message.content
        held = "" if message.tool_calls else self._held_back(message)
        return diffs, content + held if held.strip() else content

    def _held_back(self, message: ChatMessage) -> str:
        """The output past what the parse read as content and reasoning (where the parse
        only trimmed its start)."""
        text = "".join(self._text)
        read = message.reasoning + message.content
        for start in (text, text.lstrip()):
            if start.startswith(read) and not message.reasoning:
                return start[len(read):]
        return ""

    def finish(self, *, truncated: bool = False) -> ParsedMessage:
        """The whole message (flushes first, see :meth:`flush`)."""
        self.flush(truncated=truncated)
        return self._builder.build()

    def _check_calls(self, message: ChatMessage) -> None:
        """Raise :class:`ChatParseError` for a call the output opened and did not finish: one
        whose arguments are no JSON object, or an opening (the format's trigger) that no
        parsed call, content or reasoning accounts for."""
        for _, name, arguments in message.tool_calls:
            try:
                value = json.loads(arguments)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                raise ChatParseError(f"the model's call of {name!r} ended unfinished: its "
                                     f"arguments are not a JSON object ({arguments[:80]!r})")
        text = "".join(self._text)
        for opener in self._openers:
            seen = text.count(opener) - message.content.count(opener) - (
                message.reasoning.count(opener))
            if seen > len(message.tool_calls):
                raise ChatParseError(f"the model opened a tool call ({opener.strip()!r}) and "
                                     "did not finish it")

    def _delta(self, diffs: list[ChatDiff], content: str, *, final: bool) -> Delta:
        out = Delta(content=self._content_delta(content, final))
        for diff in diffs:
            out.reasoning += diff.reasoning
            if diff.index >= 0:
                self._headers(out, before=diff.index)
                self._call_piece(out, diff)
        if final:
            self._headers(out, before=len(self._calls))
        return out

    def _content_delta(self, content: str, final: bool) -> str:
        """What ``content`` (the parse's whole content, its leading newlines left out) adds
        to what went out; a parse that rewrote what went out adds nothing, so the deltas
        always add up to a content the parses gave."""
        content = content.lstrip("\r\n")  # (partial and final parses differ in these)
        if not content.startswith(self._emitted):
            return ""
        rest = content[len(self._emitted):]
        if not final and not content:
            return ""
        self._emitted = content
        return rest

    def _call_piece(self, out: Delta, diff: ChatDiff) -> None:
        if diff.index == len(self._calls):
            self._calls.append([diff.id or self._new_id(), diff.name, False])
        call = self._calls[diff.index]
        if diff.name and not call[2]:
            call[1] = diff.name  # a name parsed in pieces: the longest so far
        if not diff.arguments:
            return
        if call[2]:
            out.tool_call_deltas.append(ToolCallDelta(index=diff.index, arguments=diff.arguments))
        else:
            call[2] = True
            out.tool_call_deltas.append(ToolCallDelta(
                index=diff.index, id=call[0], name=call[1], arguments=diff.arguments))

    def _headers(self, out: Delta, *, before: int) -> None:
        """Send the headers of the named calls before index ``before`` not sent yet."""
        for index, call in enumerate(self._calls[:before]):
            if not call[2] and call[1]:
                call[2] = True
                out.tool_call_deltas.append(ToolCallDelta(index=index, id=call[0], name=call[1]))

    def _record(self, delta: Delta) -> Delta:
        self._builder.add(delta)
        return delta
