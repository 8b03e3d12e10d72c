"""OpenAI Responses request bodies (pydantic models), as the Responses API documents them.

Top-level fields are the API's; any other field must be an engine request option or a llamapy
API extra (see :func:`~.bridge.forward_extras`). Fields that need state or tools we do not
have are refused with :class:`~llamapy.errors.UnsupportedFeatureError` by
:func:`check_refused` (``previous_response_id``, ``conversation``, ``background``, ``prompt``,
``truncation: "auto"``, ``top_logprobs``, ``max_tool_calls``); accepted-and-ignored fields
change nothing we could honour (``store``: nothing is stored either way; ``user``,
``safety_identifier``, ``service_tier``, ``include``, ``stream_options``).

Input items and their content parts are validated one by one by ``type``
(:func:`parse_item`, :func:`parse_part`); items echoed back from an earlier response may carry
fields we do not use (``id``, ``status``, ``annotations``): those are data and are ignored.

A ``compaction`` item (``compaction_summary`` is Codex's other name for it) is what
``/v1/responses/compact`` returned: its ``encrypted_content`` is :data:`COMPACTION_PREFIX` and
the base64url JSON ``{"summary": ...}`` (:func:`compaction_content`): readable, not encrypted,
the tenant's own text. :func:`compaction_summary` reads it back; content of any other shape
(another server's) is a 400 naming the item.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from ..errors import InvalidOptionError, UnsupportedFeatureError
from .params import parse_body

Model = TypeVar("Model", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid")


class _Data(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="allow")


class TextPart(_Data):
    """``input_text`` / ``output_text`` / ``summary_text`` / ``reasoning_text``."""

    type: Literal["input_text", "output_text", "summary_text", "reasoning_text"]
    text: str


class RefusalPart(_Data):
    """``{"type": "refusal", "refusal": ...}`` of an earlier answer."""

    type: Literal["refusal"]
    refusal: str


class ImagePart(_Data):
    """``{"type": "input_image", "image_url": ...}``: a data URL (``file_id`` is refused:
    there is no file store)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


Part = TextPart | RefusalPart | ImagePart
PARTS: dict[str, type[Part]] = {
    "input_text": TextPart, "output_text": TextPart, "summary_text": TextPart,
    "reasoning_text": TextPart, "refusal": RefusalPart, "input_image": ImagePart,
}


class MessageItem(_Data):
    """A ``message`` item (``type`` may be omitted: the easy input message)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[dict[str, Any]]


class FunctionCallItem(_Data):
    """A ``function_call`` item of an earlier answer."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None


class FunctionCallOutputItem(_Data):
    """A ``function_call_output`` item: the result of a call."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]


class ReasoningItem(_Data):
    """A ``reasoning`` item of an earlier answer (``content``, ``summary`` or the opaque
    ``encrypted_content`` this server issued)."""

    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None


class CompactionItem(_Data):
    """A ``compaction`` item of ``/v1/responses/compact`` (see the module)."""

    type: Literal["compaction", "compaction_summary"]
    encrypted_content: str
    id: str | None = None
    created_by: str | None = None


class CompactionTriggerItem(_Strict):
    """``{"type": "compaction_trigger"}``: last in ``input``, it asks for a compaction
    (:mod:`.responses_trigger`); in a stored history it renders as nothing."""

    type: Literal["compaction_trigger"]


Item = (MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
        | CompactionItem | CompactionTriggerItem)
ITEMS: dict[str, type[Item]] = {
    "message": MessageItem, "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem,
    "compaction": CompactionItem, "compaction_summary": CompactionItem,
    "compaction_trigger": CompactionTriggerItem,
}

#: How llamapy's compaction items begin (a version: a later format gets a new prefix).
COMPACTION_PREFIX = "llamapy.compaction.v1:"


def compaction_content(summary: str) -> str:
    """The ``encrypted_content`` of a compaction item carrying ``summary``."""
    data = json.dumps({"summary": summary}, ensure_ascii=False).encode()
    return COMPACTION_PREFIX + base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def compaction_summary(content: str, where: str) -> str:
    """The summary in a compaction item's ``encrypted_content`` (``where``: its path, named
    by the 400 when the content is another server's or does not decode)."""
    if not content.startswith(COMPACTION_PREFIX):
        raise UnsupportedFeatureError(where, f"{where}: not a compaction item of this server "
                                      f"(llamapy's start with {COMPACTION_PREFIX!r}); "
                                      "another server's cannot be read here")
    text = content[len(COMPACTION_PREFIX):]
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, RecursionError):  # (bad UTF-8 is a ValueError too)
        value = None
    summary = value.get("summary") if isinstance(value, dict) else None
    if not isinstance(summary, str):
        raise InvalidOptionError(f"{where}: the compaction content does not decode to "
                                 "{\"summary\": text}", option=where)
    return summary


class FunctionTool(_Data):
    """``{"type": "function", "name", "description", "parameters", "strict"}``."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(_Strict):
    """``tool_choice: {"type": "function", "name": ..., "namespace": ...}``."""

    type: Literal["function"]
    name: str
    namespace: str | None = None


class TextFormat(_Strict):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (flat ``name``/``schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Strict):
    """``text``: the output ``format`` (and ``verbosity``, accepted)."""

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(_Strict):
    """``reasoning``: ``effort`` goes to the template; ``summary`` is accepted."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra"
                    ] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesBody(BaseModel):
    """``POST /v1/responses`` (and ``/v1/responses/input_tokens``)."""

    model_config = ConfigDict(defer_build=True, extra="allow", populate_by_name=True)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    #: Pins the whole prompt in the RAM prompt cache (``in_memory``: 5 min, ``24h``: 24 h).
    prompt_cache_retention: Literal["in_memory", "in-memory", "24h"] | None = None
    service_tier: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    #: Strict: the route runs a request in the background only when this is ``true``.
    background: StrictBool | None = None
    prompt: dict[str, Any] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tool_calls: int | None = Field(default=None, ge=1)


#: The Responses API's own field names.
RESPONSES_FIELDS = tuple(ResponsesBody.model_fields)

#: Refused fields: name -> why (each refused when set to anything but its "off" value).
REFUSED = {
    "previous_response_id": "responses are not stored; send the whole conversation in "
                            "'input' (store: false)",
    "conversation": "conversations are not stored; send the whole conversation in 'input'",
    "background": "background responses need the server's response store",
    "prompt": "stored prompt templates are not supported",
    "max_tool_calls": "max_tool_calls is not supported",
}


def check_refused(body: ResponsesBody) -> None:
    """Raise :class:`UnsupportedFeatureError` for a field we cannot honour."""
    for name, why in REFUSED.items():
        value = getattr(body, name)
        if value not in (None, False, ""):
            raise UnsupportedFeatureError(name, f"{name}: {why}")
    if body.truncation == "auto":
        raise UnsupportedFeatureError("truncation", "truncation 'auto' is not supported: a "
                                      "conversation that does not fit is an error")
    if body.top_logprobs:
        raise UnsupportedFeatureError("top_logprobs", "top_logprobs is not supported on "
                                      "/v1/responses (use /v1/chat/completions)")


def _by_type(table: Mapping[str, type[Model]], raw: object, where: str, what: str,
             default: str | None = None) -> Model:
    kind = raw.get("type", default) if isinstance(raw, Mapping) else None
    if not isinstance(kind, str):
        raise InvalidOptionError(f"{where} must be an object with a 'type'", option=where)
    model = table.get(kind)
    if model is None:
        raise UnsupportedFeatureError(kind, f"{where}: {what} type {kind!r} is not supported "
                                            f"(supported: {', '.join(table)})")
    try:
        return parse_body(model, raw)
    except InvalidOptionError as exc:
        raise InvalidOptionError(f"{where}: {exc}", option=where) from None


def parse_item(raw: object, where: str) -> Item:
    """One input item (a ``role`` without ``type`` is a message)."""
    default = "message" if isinstance(raw, Mapping) and "role" in raw else None
    return _by_type(ITEMS, raw, where, "input item", default)  # type: ignore[arg-type]


def parse_part(raw: object, where: str) -> Part:
    """One content part (files and audio are refused)."""
    return _by_type(PARTS, raw, where, "content part")  # type: ignore[arg-type]
