"""From an Anthropic Messages request to a :class:`~llamapy.openai_api.ChatPlan`.

The request is translated into a :class:`~llamapy.openai_api.chat_request.ChatRequest` (no
API's shape) and prepared by :func:`~llamapy.openai_api.prompt.prepare_request`, so the chat
template, tool instructions, forced-call grammar, request options and output parser are those
of ``/v1/chat/completions``:

- ``system`` (a string or text blocks) becomes the system message. Claude Code starts it with
  an ``x-anthropic-billing-header`` line whose ``cch=`` stamp changes on every request; the
  stamp is blanked so the prompt prefix stays cacheable.
- Blocks keep their order: a user turn's ``text`` blocks become user messages and each
  ``tool_result`` a ``tool`` message (``is_error`` prefixes the result with ``Error:``); an
  assistant turn's ``text``, ``thinking`` (as ``reasoning_content``) and ``tool_use`` (as
  ``tool_calls``) become one assistant message. ``redacted_thinking`` is opaque and dropped;
  ``image`` is refused (the model has no vision).
- History the template cannot show is inlined (:func:`~llamapy.openai_api.bridge.polyfill_history`).
- ``tools`` become functions; ``tool_choice`` ``auto``/``none``/``any``/``tool`` become
  ``auto``/``none``/``required``/the named function (the last two force a call by grammar).
- ``stop_sequences``, ``temperature``, ``top_p``, ``top_k`` map to engine options;
  ``metadata.user_id`` becomes the ``session`` affinity key; ``thinking`` sets the template's
  ``enable_thinking``; ``output_config.format`` is ``response_format`` ``json_schema``.
  Reasoning (``<think>``) is always parsed out of the answer.
- ``cache_control`` breakpoints become the ``cache_pins`` option (:mod:`.cache_control`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidOptionError, UnsupportedFeatureError
from ..openai_api.bridge import api_id, extra_fields, forward_extras, polyfill_history
from ..openai_api.chat_request import ChatRequest, api_extras
from ..openai_api.params import ResponseFormat, parse_body
from ..openai_api.prompt import ChatPlan, prepare_request
from ..openai_api.target import ServedModel
from .cache_control import breakpoints, cache_pins
from .params import (
    MESSAGES_FIELDS,
    Block,
    ImageBlock,
    InputMessage,
    MessagesBody,
    TextBlock,
    ThinkingBlock,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
    parse_block,
    parse_tool,
)

BILLING_HEADER = "x-anthropic-billing-header:"
_BILLING_STAMP = re.compile(r"cch=[0-9A-Za-z]*;")
#: Engine options the translation sets from Anthropic's own fields.
OWNED_OPTIONS = ("stop", "temp", "temperature", "top_p", "top_k", "cache_pins")


@dataclass(frozen=True, slots=True, kw_only=True)
class MessagesPlan:
    """A Messages request ready to run: the chat plan and the message id."""

    chat: ChatPlan
    body: MessagesBody
    id: str = field(default_factory=lambda: api_id("msg"))

    @property
    def model_name(self) -> str:
        """The ``model`` field of responses."""
        return self.chat.model_name


def system_text(system: str | list[TextBlock] | None) -> str | None:
    """The system prompt (text blocks joined by newlines), billing stamp blanked."""
    if system is None:
        return None
    texts = [system] if isinstance(system, str) else [block.text for block in system]
    out = []
    for text in texts:
        if text.startswith(BILLING_HEADER):
            text = _BILLING_STAMP.sub("cch=00000;", text, count=1)
        out.append(text)
    return "\n".join(out)


def _tool_result_content(block: ToolResultBlock, where: str) -> str | list[dict[str, Any]]:
    """A tool result as the template's tool message content: its text, or text and image
    parts when it holds images."""
    content = block.content
    prefix = "Error: " if block.is_error else ""
    if not isinstance(content, list):
        return prefix + (content or "")
    parts: list[dict[str, Any]] = [{"type": "text", "text": prefix}] if prefix else []
    for j, raw in enumerate(content):
        part = parse_block(raw, f"{where}.content[{j}]")
        if isinstance(part, TextBlock):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, ImageBlock):
            parts.append(image_part(part))
        else:
            raise UnsupportedFeatureError(
                part.type, f"{where}: tool_result content may only hold text and image blocks")
    if all(p["type"] == "text" for p in parts):
        return prefix + "\n".join(p["text"] for p in parts[1 if prefix else 0:])
    return parts


def image_part(block: ImageBlock) -> dict[str, Any]:
    """An image block as an OpenAI ``image_url`` part (a base64 source as a data URL; a
    ``url`` source as it is, which the media layer refuses unless it is a data URL)."""
    source = block.source
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', '')};base64,{source.get('data', '')}"
    else:
        url = str(source.get("url", ""))
    return {"type": "image_url", "image_url": {"url": url}}


def _refuse_image(block: Block, where: str) -> None:
    if isinstance(block, ImageBlock):
        raise InvalidOptionError(f"{where}: images belong in a user turn", option=where)


def _user_messages(blocks: list[Block], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            texts.append(image_part(block))
        elif isinstance(block, ToolResultBlock):
            if texts:
                out.append({"role": "user", "content": texts})
                texts = []
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": _tool_result_content(block, f"{where}[{j}]")})
        else:
            raise InvalidOptionError(f"{where}[{j}]: a user turn cannot hold {block.type!r} "
                                     "blocks", option=where)
    if texts or not out:
        out.append({"role": "user", "content": texts})
    return out


def _assistant_message(blocks: list[Block], where: str) -> dict[str, Any]:
    texts, reasoning, calls = [], [], []
    for j, block in enumerate(blocks):
        _refuse_image(block, f"{where}[{j}]")
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function", "function": {
                "name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif isinstance(block, ToolResultBlock):
            raise InvalidOptionError(f"{where}[{j}]: tool_result belongs in a user turn",
                                     option=where)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(messages: list[InputMessage]) -> list[dict[str, Any]]:
    """Anthropic ``messages`` as OpenAI chat messages (before polyfilling)."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}].content"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        blocks = [parse_block(raw, f"{where}[{j}]") for j, raw in enumerate(message.content)]
        if message.role == "user":
            out.extend(_user_messages(blocks, where))
        else:
            out.append(_assistant_message(blocks, where))
    return out


def _parallel(choice: ToolChoice | None) -> bool | None:
    """``disable_parallel_tool_use`` as ``parallel_tool_calls`` (None: as the template can)."""
    if choice is None or choice.disable_parallel_tool_use is None:
        return None
    return not choice.disable_parallel_tool_use


def _tool_choice(choice: ToolChoice | None) -> str | dict[str, Any] | None:
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise InvalidOptionError("tool_choice of type 'tool' needs a 'name'",
                                     option="tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "none": "none", "any": "required"}[choice.type]


def _tools(body: MessagesBody) -> list[dict[str, Any]] | None:
    if body.tools is None:
        return None
    tools = [parse_tool(raw, i) for i, raw in enumerate(body.tools)]
    return [{"type": "function", "function": {
        "name": tool.name, "parameters": tool.input_schema,
        **({"description": tool.description} if tool.description else {})}} for tool in tools]


def _response_format(body: MessagesBody) -> ResponseFormat | None:
    fmt = body.output_config.format if body.output_config else None
    if fmt is None:
        return None
    return parse_body(ResponseFormat, {"type": "json_schema", "json_schema": {
        "name": "output", "schema": fmt.schema_}})


def _template_kwargs(body: MessagesBody, extra: dict[str, Any]) -> dict[str, Any] | None:
    kwargs = extra.pop("chat_template_kwargs", None)
    if body.thinking is None:
        return kwargs
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidOptionError("chat_template_kwargs must be an object",
                                 option="chat_template_kwargs")
    return {"enable_thinking": body.thinking.type != "disabled", **(kwargs or {})}


def chat_request(served: ServedModel, body: MessagesBody) -> ChatRequest:
    """The :class:`~llamapy.openai_api.chat_request.ChatRequest` a Messages body stands for."""
    extra = forward_extras(body.model_extra or {}, fields=MESSAGES_FIELDS, owned=OWNED_OPTIONS)
    kwargs = _template_kwargs(body, extra)
    messages = chat_messages(body.messages)
    system = system_text(body.system)
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    own = {"stop": body.stop_sequences, "temperature": body.temperature, "top_p": body.top_p,
           "top_k": body.top_k, "session": body.metadata.user_id if body.metadata else None}
    fields = {key: value for key, value in own.items() if value is not None}
    if body.thinking is not None and body.thinking.budget_tokens is not None:
        fields["reasoning_budget"] = body.thinking.budget_tokens
    fields.update(extra_fields(extra))
    extras = api_extras(extra)
    if kwargs is not None:
        extras["chat_template_kwargs"] = kwargs
    return ChatRequest(
        messages=tuple(polyfill_history(served.chat_templates().source, messages)),
        model=body.model, tools=tuple(_tools(body) or ()),
        tool_choice=_tool_choice(body.tool_choice), response_format=_response_format(body),
        parallel_tool_calls=_parallel(body.tool_choice),
        fields=fields, extras=extras, max_tokens=body.max_tokens)


def prepare_messages(served: ServedModel, request: Mapping[str, Any], *,
                     generate: bool = True) -> MessagesPlan:
    """Validate a Messages request and prepare it (``generate=False``: for counting only, so
    ``max_tokens`` may be absent)."""
    body = parse_body(MessagesBody, request)
    if generate and body.max_tokens is None:
        raise InvalidOptionError("max_tokens is required", option="max_tokens")
    points = breakpoints(body)
    chat = prepare_request(served, chat_request(served, body))
    if generate and points:
        chat.intent = served.revise(chat.intent, cache_pins=cache_pins(
            served, body, chat.token_ids, points, chat_request))
    return MessagesPlan(chat=chat, body=body)
