"""Normalise OpenAI-shaped messages and tools before a chat template sees them.

Templates are written against Hugging Face conventions, which differ from the OpenAI wire
format in three places, handled here the way llama.cpp's template polyfills do:

- ``content`` may be a list of ``{"type": "text", "text": ...}`` parts: the texts are joined
  with ``"\\n"``, and a ``{"type": "media_marker", "text": ...}`` part (where an image or audio
  clip stood) is joined with no newline before or after it, as llama-server joins them. Other
  part types are refused.
- ``content: null`` (an assistant turn that only calls tools) becomes ``""``, so templates that
  concatenate ``message['content']`` still render.
- ``tool_calls[*].function.arguments`` is a JSON *string* on the wire, but most templates
  (Qwen, Llama 3, Mistral) apply ``| tojson`` to it and expect an object. It becomes a
  :class:`ToolArguments`: a ``dict`` (so ``tojson`` and ``.items()`` work) whose string form is
  the original JSON text (so ``{{ arguments }}`` and ``'...' + arguments`` work too).

Every other key (``name``, ``tool_call_id``, ``reasoning_content``, ...) passes through
unchanged. Inputs are never mutated.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from llamapy.errors import TemplateError, UnsupportedFeatureError


class ToolArguments(dict[str, Any]):
    """Tool-call arguments that are both a dict and, as a string, their JSON text."""

    def __init__(self, values: Mapping[str, Any], text: str) -> None:
        super().__init__(values)
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __add__(self, other: object) -> str:
        if isinstance(other, str):
            return self.text + other
        return NotImplemented

    def __radd__(self, other: object) -> str:
        if isinstance(other, str):
            return other + self.text
        return NotImplemented


def arguments_value(arguments: object) -> object:
    """Template-facing form of a tool call's ``arguments`` (see :class:`ToolArguments`)."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return ToolArguments(parsed, arguments) if isinstance(parsed, dict) else arguments
    if isinstance(arguments, Mapping):
        return ToolArguments(arguments, json.dumps(arguments, ensure_ascii=False))
    return arguments


def _content_text(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TemplateError(f"messages[{index}].content must be a string or a list of parts")
    text, after_marker = "", False
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("text", "media_marker"):
            raise UnsupportedFeatureError(
                feature=str(kind), message=f"messages[{index}]: content part {kind!r} unsupported"
            )
        if kind == "text" and text and not after_marker:
            text += "\n"
        text += str(part.get("text", ""))
        after_marker = kind == "media_marker"
    return text


def _tool_call(call: object, index: int) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise TemplateError(f"messages[{index}].tool_calls entries must be objects")
    out = copy.deepcopy(dict(call))
    function = out.get("function")
    if isinstance(function, dict) and "arguments" in function:
        function["arguments"] = arguments_value(function["arguments"])
    if "arguments" in out:
        out["arguments"] = arguments_value(out["arguments"])
    return out


def normalize_message(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    """One message in template-ready form; raises :class:`TemplateError` when malformed."""
    if not isinstance(message, Mapping):
        raise TemplateError(f"messages[{index}] must be an object")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise TemplateError(f"messages[{index}] has no role")
    out = {key: copy.deepcopy(value) for key, value in message.items() if key != "tool_calls"}
    out["content"] = _content_text(message.get("content"), index)
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise TemplateError(f"messages[{index}].tool_calls must be a list")
        out["tool_calls"] = [_tool_call(call, index) for call in calls]
    return out


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Template-ready copies of OpenAI-shaped messages."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TemplateError("messages must be a list of message objects")
    return [normalize_message(message, index) for index, message in enumerate(messages)]


def normalize_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Deep copies of the tools (``None`` and ``[]`` both mean no tools, as in HF)."""
    if not tools:
        return None
    if not all(isinstance(tool, Mapping) for tool in tools):
        raise TemplateError("tools must be a list of objects")
    return [copy.deepcopy(dict(tool)) for tool in tools]
