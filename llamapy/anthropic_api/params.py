"""Anthropic Messages request bodies (pydantic models), as the Messages API documents them.

Top-level fields are Anthropic's (``model``, ``messages``, ``max_tokens``, ``system``,
``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``metadata``, ``tools``,
``tool_choice``, ``thinking``, ``output_config``, ``stream``, ``cache_control`` (see
:mod:`.cache_control`); ``service_tier``, ``inference_geo`` and ``speed`` are accepted and
change nothing); any other
field must be an engine request option or a llamapy API extra (see
:func:`~llamapy.openai_api.bridge.forward_extras`).
Content blocks are validated one by one by their ``type`` (:func:`parse_block`), so a block we
do not support (``image``, ``document``, server tool blocks) is a clear
:class:`~llamapy.errors.UnsupportedFeatureError` rather than a union mismatch. Blocks echoed
back from a response may carry fields we do not use (``citations``): those are data, not
options, and are ignored; a block's ``cache_control`` is a cache breakpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import InvalidOptionError, UnsupportedFeatureError
from ..openai_api.params import parse_body


class _Strict(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid")


class _Block(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="allow")


class TextBlock(_Block):
    """``{"type": "text", "text": ...}``."""

    type: Literal["text"]
    text: str


class ImageBlock(_Block):
    """``{"type": "image", "source": ...}``: ``{"type": "base64", "media_type", "data"}``
    (a ``url`` source is refused: the server fetches nothing)."""

    type: Literal["image"]
    source: dict[str, Any]


class ThinkingBlock(_Block):
    """``{"type": "thinking", "thinking": ..., "signature": ...}`` of an earlier answer."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    """``{"type": "redacted_thinking", "data": ...}``: opaque, nothing to show the model."""

    type: Literal["redacted_thinking"]
    data: str = ""


class ToolUseBlock(_Block):
    """``{"type": "tool_use", "id", "name", "input"}`` of an earlier answer."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_Block):
    """``{"type": "tool_result", "tool_use_id", "content", "is_error"}``."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool = False


Block = (TextBlock | ImageBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock
         | ToolResultBlock)

#: Content block models by ``type``.
BLOCKS: dict[str, type[Block]] = {
    "text": TextBlock, "image": ImageBlock, "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock, "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
}


def parse_block(raw: object, where: str) -> Block:
    """One content block; an unknown ``type`` is an :class:`UnsupportedFeatureError`."""
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if not isinstance(kind, str):
        raise InvalidOptionError(f"{where} must be an object with a 'type'", option=where)
    model = BLOCKS.get(kind)
    if model is None:
        raise UnsupportedFeatureError(
            kind, f"{where}: content block type {kind!r} is not supported "
                  f"(supported: {', '.join(BLOCKS)})")
    try:
        return parse_body(model, raw)
    except InvalidOptionError as exc:
        raise InvalidOptionError(f"{where}: {exc}", option=where) from None


class InputMessage(_Strict):
    """One entry of ``messages``."""

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class ToolDef(_Block):
    """A client tool: ``name``, ``description``, ``input_schema`` (``type`` ``custom``)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None


class ToolChoice(_Strict):
    """``tool_choice``: ``auto``, ``any``, ``tool`` (with ``name``) or ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Strict):
    """``thinking``: ``{"type": "enabled", "budget_tokens": N}``, ``disabled``, ``adaptive``
    or ``between_tools``.

    ``budget_tokens`` bounds the reasoning block (its end is forced past it, as llama.cpp's
    reasoning budget does, when the template's format has one); ``display`` is accepted, and
    parsed reasoning is always returned.
    """

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=1)
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(_Strict):
    """``output_config.format``: ``{"type": "json_schema", "schema": ...}``."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    """``output_config``: ``format`` is structured output under a grammar; ``effort`` is
    accepted."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Metadata(_Strict):
    """``metadata``; ``user_id`` routes a conversation to its slot (the ``session`` option)."""

    user_id: str | None = None


class MessagesBody(BaseModel):
    """``POST /v1/messages`` (and, with ``max_tokens`` optional, ``count_tokens``)."""

    model_config = ConfigDict(defer_build=True, extra="allow")

    model: str | None = None
    messages: list[InputMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    stream: bool = False
    #: The whole prompt's cache breakpoint (checked by :mod:`.cache_control`).
    cache_control: dict[str, Any] | None = None
    #: Accepted, change nothing: there is one tier, speed and place.
    service_tier: Literal["auto", "standard_only"] | None = None
    inference_geo: str | None = None
    speed: Literal["standard", "fast"] | None = None


#: The Messages API's own field names.
MESSAGES_FIELDS = tuple(MessagesBody.model_fields)


def parse_tool(raw: object, index: int) -> ToolDef:
    """One entry of ``tools``; server tools (``web_search_...``, ``bash_...``) are refused."""
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if kind not in (None, "custom"):
        raise UnsupportedFeatureError(
            str(kind), f"tools[{index}]: server tool type {kind!r} is not supported; "
                       "only client tools (name, description, input_schema) are")
    try:
        return parse_body(ToolDef, raw)
    except InvalidOptionError as exc:
        raise InvalidOptionError(f"tools[{index}]: {exc}", option=f"tools.{index}") from None
