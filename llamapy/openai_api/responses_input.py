"""From an OpenAI Responses request to a :class:`~.prompt.ChatPlan`.

The request is translated into a :class:`~.chat_request.ChatRequest` (no API's shape) and
prepared by :func:`~.prompt.prepare_request` (same template, tool instructions, forced-call
grammar, options and output parser as ``/v1/chat/completions``):

- ``instructions`` becomes the system message; a string ``input`` one user message.
- Items keep their order: ``message`` items become messages (``developer`` a system message);
  ``reasoning``, assistant ``message`` and ``function_call`` items that follow each other form
  one assistant turn (reasoning as ``reasoning_content``, calls as ``tool_calls``);
  ``function_call_output`` becomes a ``tool`` message (its images, if any, a user message
  after it); a ``compaction`` item (what
  ``/v1/responses/compact`` returned) becomes the user message :data:`SUMMARY_HEADING` and its
  summary, the same text every time, so a compacted history renders (and reuses its KV) alike
  on every turn. History the template cannot show is inlined
  (:func:`~.bridge.polyfill_history`).
- ``tools`` become chat tools (function tools, a namespace's functions under joined names,
  hosted tools left out: :mod:`.responses_tools`); ``tool_choice`` ``required`` or
  ``{"type": "function", "name"}`` force a call by grammar.
- ``max_output_tokens``, ``temperature``, ``top_p`` map to engine options; ``text.format``
  to ``response_format`` (``json_schema`` is structured output under a grammar);
  ``prompt_cache_key`` becomes the ``session`` affinity key; ``reasoning.effort`` goes to the
  template (``none`` sets ``enable_thinking: false``). Reasoning is always parsed out.
- ``prompt_cache_retention`` pins the whole prompt in the RAM prompt cache
  (:func:`~.prompt.chat_fields`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidOptionError, UnsupportedFeatureError
from .bridge import api_id, extra_fields, forward_extras, polyfill_history
from .chat_request import ChatRequest, api_extras
from .params import RETENTION_S, ResponseFormat, parse_body
from .prompt import ChatPlan, prepare_request
from .responses_params import (
    RESPONSES_FIELDS,
    CompactionItem,
    CompactionTriggerItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    FunctionTool,
    ImagePart,
    Item,
    MessageItem,
    ReasoningItem,
    RefusalPart,
    ResponsesBody,
    TextFormat,
    check_refused,
    compaction_summary,
    parse_item,
    parse_part,
)
from .responses_tools import Namespaces, joined_name, offered_tools
from .target import ServedModel

#: Engine options the translation sets from the API's own fields.
OWNED_OPTIONS = ("temp", "temperature", "top_p", "cache_pins")
#: What a compaction item's summary is introduced with (as a user message).
SUMMARY_HEADING = "Summary of the conversation so far:\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponsesPlan:
    """A Responses request ready to run: the chat plan, the body, the response id."""

    chat: ChatPlan
    body: ResponsesBody
    id: str = field(default_factory=lambda: api_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_name(self) -> str:
        """The ``model`` field of responses."""
        return self.chat.model_name

    @property
    def namespaces(self) -> Namespaces:
        """The namespaced functions offered (to name a call's ``namespace``)."""
        return offered_tools(self.body.tools)[1]

    @property
    def encrypt_reasoning(self) -> bool:
        """Whether reasoning items carry ``encrypted_content`` (asked for with ``include``)."""
        return "reasoning.encrypted_content" in (self.body.include or ())


def _parts_text(content: str | list[dict[str, Any]], where: str) -> str:
    text = _parts_content(content, where)
    if not isinstance(text, str):
        raise InvalidOptionError(f"{where}: images belong in user input", option=where)
    return text


def _parts_content(content: str | list[dict[str, Any]], where: str
                   ) -> str | list[dict[str, Any]]:
    """A message's content: its text, or text and ``image_url`` parts when it has images."""
    if isinstance(content, str):
        return content
    parts = [parse_part(raw, f"{where}[{j}]") for j, raw in enumerate(content)]
    if not any(isinstance(part, ImagePart) for part in parts):
        return "".join(part.refusal if isinstance(part, RefusalPart) else part.text
                       for part in parts if not isinstance(part, ImagePart))
    out: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        if isinstance(part, ImagePart):
            if part.image_url is None:
                raise UnsupportedFeatureError("file_id", f"{where}[{j}]: input_image needs an "
                                              "image_url (there is no file store)")
            out.append({"type": "image_url", "image_url": {"url": part.image_url}})
        else:
            out.append({"type": "text", "text": part.refusal if isinstance(part, RefusalPart)
                        else part.text})
    return out


def _assistant_turn(messages: list[dict[str, Any]], *, reasoning: bool = False
                    ) -> dict[str, Any]:
    """The assistant message an assistant-side item joins (a reasoning item starts a turn
    unless the open one is still empty)."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        started = last["content"] or last.get("tool_calls") or last.get("reasoning_content")
        if not (reasoning and started):
            return last
    turn: dict[str, Any] = {"role": "assistant", "content": ""}
    messages.append(turn)
    return turn


def _reasoning_text(item: ReasoningItem, where: str) -> str:
    for source in (item.content, item.summary):
        if source:
            return "\n".join(parse_part(raw, f"{where}[{j}]").text  # type: ignore[union-attr]
                             for j, raw in enumerate(source))
    return item.encrypted_content or ""


def _add_item(messages: list[dict[str, Any]], item: Item, where: str) -> None:
    if isinstance(item, MessageItem) and item.role != "assistant":
        role = "system" if item.role == "developer" else item.role
        messages.append({"role": role,
                         "content": _parts_content(item.content, f"{where}.content")})
    elif isinstance(item, MessageItem):
        turn = _assistant_turn(messages)
        text = _parts_text(item.content, f"{where}.content")
        turn["content"] += ("\n" if turn["content"] and text else "") + text
    elif isinstance(item, FunctionCallItem):
        _assistant_turn(messages).setdefault("tool_calls", []).append(
            {"id": item.call_id, "type": "function",
             "function": {"name": joined_name(item.namespace, item.name),
                          "arguments": item.arguments}})
    elif isinstance(item, FunctionCallOutputItem):
        _add_output(messages, item, f"{where}.output")
    elif isinstance(item, CompactionTriggerItem):
        return
    elif isinstance(item, CompactionItem):
        summary = compaction_summary(item.encrypted_content, f"{where}.encrypted_content")
        messages.append({"role": "user", "content": SUMMARY_HEADING + summary})
    else:
        text = _reasoning_text(item, f"{where}.content")
        if text:
            _assistant_turn(messages, reasoning=True)["reasoning_content"] = text


def _add_output(messages: list[dict[str, Any]], item: FunctionCallOutputItem, where: str
                ) -> None:
    """A call's output as a ``tool`` message; its images (Codex's ``view_image``), which no
    template shows in a tool message, follow in a user message of their own."""
    content = _parts_content(item.output, where)
    if isinstance(content, str):
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
        return
    text = "".join(part["text"] for part in content if part["type"] == "text")
    images = [part for part in content if part["type"] == "image_url"]
    messages.append({"role": "tool", "tool_call_id": item.call_id,
                     "content": text or f"({len(images)} image(s), in the next message)"})
    messages.append({"role": "user", "content": [
        {"type": "text", "text": f"The image(s) the call {item.call_id} returned:"}, *images]})


def chat_messages(body: ResponsesBody) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as OpenAI chat messages (before polyfilling)."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
        return messages
    for i, raw in enumerate(body.input):
        _add_item(messages, parse_item(raw, f"input[{i}]"), f"input[{i}]")
    return messages


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description,
                "parameters": tool.parameters, "strict": tool.strict}
    return {"type": "function",
            "function": {key: value for key, value in function.items() if value is not None}}


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") != "function":
        kind = str(choice.get("type"))
        raise UnsupportedFeatureError(kind, f"tool_choice of type {kind!r} is not supported "
                                            "(use none, auto, required or a function)")
    named = parse_body(FunctionChoice, choice)
    return {"type": "function", "function": {"name": joined_name(named.namespace, named.name)}}


def _response_format(fmt: TextFormat | None) -> ResponseFormat | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return parse_body(ResponseFormat, {"type": "json_object"})
    if fmt.schema_ is None:
        raise InvalidOptionError("text.format json_schema needs a 'schema'",
                                 option="text.format.schema")
    schema = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict,
              "description": fmt.description}
    return parse_body(ResponseFormat, {"type": "json_schema", "json_schema": {
        key: value for key, value in schema.items() if value is not None}})


def _template_kwargs(body: ResponsesBody, extra: dict[str, Any]) -> Any:
    kwargs = extra.pop("chat_template_kwargs", None)
    effort = body.reasoning.effort if body.reasoning else None
    if effort is None:
        return kwargs
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidOptionError("chat_template_kwargs must be an object",
                                 option="chat_template_kwargs")
    own = {"enable_thinking": False} if effort == "none" else {"reasoning_effort": effort}
    return {**own, **(kwargs or {})}


def chat_request(served: ServedModel, body: ResponsesBody) -> ChatRequest:
    """The :class:`~.chat_request.ChatRequest` a Responses body stands for."""
    extra = forward_extras(body.model_extra or {}, fields=RESPONSES_FIELDS, owned=OWNED_OPTIONS)
    kwargs = _template_kwargs(body, extra)
    tools, _ = offered_tools(body.tools)
    own = {"temperature": body.temperature, "top_p": body.top_p,
           "session": body.prompt_cache_key}
    fields = {key: value for key, value in own.items() if value is not None}
    fields.update(extra_fields(extra))
    extras = api_extras(extra)
    if kwargs is not None:
        extras["chat_template_kwargs"] = kwargs
    retention = body.prompt_cache_retention
    return ChatRequest(
        messages=tuple(polyfill_history(served.chat_templates().source, chat_messages(body))),
        model=body.model, tools=tuple(_chat_tool(tool) for tool in tools),
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=bool(body.parallel_tool_calls),
        response_format=_response_format(body.text.format if body.text else None),
        fields=fields, extras=extras, max_tokens=body.max_output_tokens,
        retention_s=None if retention is None else RETENTION_S[retention])


def prepare_responses(served: ServedModel, request: Mapping[str, Any]) -> ResponsesPlan:
    """Validate a Responses request and turn it into a :class:`ResponsesPlan`."""
    body = parse_body(ResponsesBody, request)
    check_refused(body)
    return ResponsesPlan(chat=prepare_request(served, chat_request(served, body)), body=body)
