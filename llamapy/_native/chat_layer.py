"""llama.cpp's chat layer (``common/chat.h``) through the shim, JSON in and out.

:class:`ChatTemplates` holds a model's chat templates (or one given as source) and renders a
conversation with tools into a prompt, the grammar and lazy triggers that make a tool call or
a JSON answer, extra stop strings and the serialized output parser
(:meth:`ChatTemplates.apply`). :class:`ChatStream` parses one generation with that parser,
piece by piece: each :meth:`ChatStream.feed` parses the whole output again and returns the
differences to the previous parse (content, reasoning, tool-call pieces), as llama-server
streams them. A C++ exception never crosses into Python: it is a :class:`TemplateError`
(rendering) or a :class:`ChatParseError` (parsing).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ChatParseError, LlamapyError, TemplateError
from ._loader import native
from ._shim import WHAT_SIZE, Status, shim_error
from .owned import Owned, not_null

__all__ = ["ChatDiff", "ChatMessage", "ChatParams", "ChatStream", "ChatTemplates", "ChatTrigger"]

#: ``common_grammar_trigger_type``: the kinds of a lazy grammar's trigger.
TRIGGER_KINDS = ("token", "word", "pattern", "pattern_full")


def _call(fn: Any, *args: Any, error: type[LlamapyError], function: str) -> str:
    """Run a shim chat call whose last three arguments are ``out``, ``what``, ``what_size``;
    the JSON text it returned."""
    nat = native()
    out = nat.ffi.new("char **")
    what = nat.ffi.new("char[]", WHAT_SIZE)
    status = fn(*args, out, what, WHAT_SIZE)
    try:
        if status != Status.OK:
            message = nat.ffi.string(what).decode("utf-8", "replace")
            if status == Status.NO_MEMORY:
                raise shim_error(status, message, function)
            raise error(message)
        return str(nat.ffi.string(out[0]).decode("utf-8", "replace"))
    finally:
        if out[0] != nat.ffi.NULL:
            nat.shim.llamapy_chat_free_string(out[0])


@dataclass(frozen=True, slots=True)
class ChatTrigger:
    """A lazy grammar's trigger: ``kind`` one of :data:`TRIGGER_KINDS`; ``value`` the word or
    pattern; ``token`` the token id of a ``token`` trigger."""

    kind: str
    value: str
    token: int


@dataclass(frozen=True, slots=True)
class ChatParams:
    """What the chat layer made of a conversation (``common_chat_params``)."""

    format: int
    format_name: str
    prompt: str
    grammar: str
    grammar_lazy: bool
    generation_prompt: str
    supports_thinking: bool
    thinking_start_tag: str
    thinking_end_tags: tuple[str, ...]
    triggers: tuple[ChatTrigger, ...]
    preserved_tokens: tuple[str, ...]
    additional_stops: tuple[str, ...]
    parser: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChatParams:
        """From the shim's JSON."""
        triggers = tuple(ChatTrigger(TRIGGER_KINDS[int(t["type"])], str(t["value"]),
                                     int(t["token"])) for t in data["grammar_triggers"])
        return cls(
            format=int(data["format"]), format_name=str(data["format_name"]),
            prompt=str(data["prompt"]), grammar=str(data["grammar"]),
            grammar_lazy=bool(data["grammar_lazy"]),
            generation_prompt=str(data["generation_prompt"]),
            supports_thinking=bool(data["supports_thinking"]),
            thinking_start_tag=str(data["thinking_start_tag"]),
            thinking_end_tags=tuple(data["thinking_end_tags"]), triggers=triggers,
            preserved_tokens=tuple(data["preserved_tokens"]),
            additional_stops=tuple(data["additional_stops"]), parser=str(data["parser"]))


class ChatTemplates(Owned):
    """A model's chat templates, or ``source`` (then ``model`` only lends its BOS/EOS tokens
    and may be None). Rendering is thread-safe; the model may be closed afterwards."""

    KIND = "chat templates"

    def __init__(self, model: Any | None, source: str = "", *, bos: str = "",
                 eos: str = "") -> None:
        nat = native()
        out = nat.ffi.new("struct llamapy_chat_templates **")
        what = nat.ffi.new("char[]", WHAT_SIZE)
        status = nat.shim.llamapy_chat_templates_init(
            model.ptr if model is not None else nat.ffi.NULL, source.encode(), bos.encode(),
            eos.encode(), out, what, WHAT_SIZE)
        if status != Status.OK:
            raise TemplateError("the chat template cannot be used: "
                                + nat.ffi.string(what).decode("utf-8", "replace"))
        self._ptr = not_null(out[0], lambda: TemplateError("no chat template"))
        self._info: dict[str, Any] = json.loads(_call(
            nat.shim.llamapy_chat_templates_info, self._ptr, error=TemplateError,
            function="llamapy_chat_templates_info"))

    def _free(self, ptr: Any) -> None:
        native().shim.llamapy_chat_templates_free(ptr)

    @property
    def caps(self) -> dict[str, bool]:
        """The template's capabilities (``supports_tools``, ``supports_tool_calls``, ...)."""
        return {str(k): bool(v) for k, v in self._info["caps"].items()}

    @property
    def source(self) -> str:
        """The default template's source."""
        return str(self._info["source"])

    @property
    def tool_use_source(self) -> str:
        """The tool-use variant's source ("" when the model has none)."""
        return str(self._info["tool_use_source"])

    @property
    def explicit(self) -> bool:
        """Whether the model had a template or one was given (else ChatML is used)."""
        return bool(self._info["explicit"])

    @property
    def supports_enable_thinking(self) -> bool:
        """Whether the template reads ``enable_thinking``."""
        return bool(self._info["supports_enable_thinking"])

    def apply(self, inputs: Mapping[str, Any]) -> ChatParams:
        """Render ``inputs`` (``messages`` and ``tools`` in OpenAI's shape, ``tool_choice``
        ``auto``/``required``/``none``, ``json_schema`` text, ``grammar``,
        ``add_generation_prompt``, ``continue_final_message``, ``parallel_tool_calls``,
        ``reasoning_format``, ``enable_thinking``, ``chat_template_kwargs``, ``use_jinja``,
        ``add_bos``, ``add_eos``); a template that raises is a :class:`TemplateError`."""
        text = json.dumps(inputs, ensure_ascii=False)
        raw = _call(native().shim.llamapy_chat_apply, self.ptr, text.encode(),
                    error=TemplateError, function="llamapy_chat_apply")
        return ChatParams.from_json(json.loads(raw))


@dataclass(frozen=True, slots=True)
class ChatDiff:
    """One difference between two parses: text added to the reasoning or the content, or a
    piece of the tool call at ``index`` (-1: none)."""

    reasoning: str
    content: str
    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """A parsed assistant message; each call is ``(id, name, arguments)``."""

    content: str
    reasoning: str
    tool_calls: tuple[tuple[str, str, str], ...]


class ChatStream(Owned):
    """The parser of one generation (``params``: ``format``, ``parser``,
    ``generation_prompt`` from :class:`ChatParams`, ``reasoning_format``,
    ``reasoning_in_content``, ``parse_tool_calls``, ``is_continuation``). Not thread-safe:
    one consumer feeds it."""

    KIND = "chat stream"

    def __init__(self, params: Mapping[str, Any]) -> None:
        nat = native()
        out = nat.ffi.new("struct llamapy_chat_stream **")
        what = nat.ffi.new("char[]", WHAT_SIZE)
        status = nat.shim.llamapy_chat_stream_new(json.dumps(params).encode(), out, what,
                                                  WHAT_SIZE)
        if status != Status.OK:
            raise ChatParseError(nat.ffi.string(what).decode("utf-8", "replace"))
        self._ptr = not_null(out[0], lambda: ChatParseError("no chat parser"))
        self._lock = threading.Lock()

    def _free(self, ptr: Any) -> None:
        native().shim.llamapy_chat_stream_free(ptr)

    def feed(self, text: str, *, final: bool = False) -> tuple[list[ChatDiff], ChatMessage]:
        """Append ``text`` and parse the output so far (``final``: the generation ended, so
        an unfinished call is an error); the differences to the last parse and the message.
        """
        data = text.encode()
        with self._lock:
            raw = _call(native().shim.llamapy_chat_stream_feed, self.ptr, data, len(data),
                        not final, error=ChatParseError, function="llamapy_chat_stream_feed")
        parsed = json.loads(raw)
        diffs = [ChatDiff(d["reasoning_content"], d["content"], int(d["index"]), d["id"],
                          d["name"], d["arguments"]) for d in parsed["diffs"]]
        msg = parsed["msg"]
        calls = tuple((c["id"], c["name"], c["arguments"]) for c in msg["tool_calls"])
        return diffs, ChatMessage(msg["content"], msg["reasoning_content"], calls)
