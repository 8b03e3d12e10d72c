"""Anthropic prompt caching: ``cache_control`` breakpoints as the ``cache_pins`` request option.

A ``cache_control`` of ``{"type": "ephemeral", "ttl": "5m" | "1h"}`` (``ttl`` defaults to
``5m``) may sit on a tool definition, a ``system`` text block, a message's content block, or
the request itself. A breakpoint asks to keep the prompt prefix that ends at its block cached
for its time to live, the blocks taken in Anthropic's order: ``tools``, then ``system``, then
``messages``. The top-level ``cache_control`` keeps the whole prompt. At most
:data:`MAX_BREAKPOINTS` breakpoints (the top-level one included), and a ``1h`` breakpoint may
not follow a ``5m`` one, as Anthropic defines them; anything else is an
:class:`~llamapy.errors.InvalidOptionError` (HTTP 400). A ``cache_control`` inside a
``tool_result``'s content is accepted and changes nothing.

The prefix of a breakpoint is measured in the rendered prompt: the request is rendered again
with everything after the breakpoint's block left out (and no generation prompt), and the
prefix is the tokens that rendering shares with the whole prompt's. The chat template decides
where each part lands, so a breakpoint on a tool covers what the template puts before the
tools (with tool instructions written into the system message, the system prompt comes first,
and a tools-only breakpoint then keeps only the template's header). A truncated request the
template refuses to render keeps nothing for that breakpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ..engine.cache.ram import common_prefix
from ..engine.media import MediaPrompt, media_floor
from ..errors import InvalidOptionError, LlamapyError
from ..openai_api.chat_request import ChatRequest
from ..openai_api.media_parts import take_media
from ..openai_api.params import parse_body
from ..openai_api.prompt import render_prompt
from ..openai_api.target import ServedModel
from .params import MessagesBody

__all__ = ["MAX_BREAKPOINTS", "CacheControl", "breakpoints", "cache_pins"]

#: Translates a Messages body into the chat request it stands for.
ToChat = Callable[[ServedModel, MessagesBody], ChatRequest]

#: Most ``cache_control`` breakpoints of one request.
MAX_BREAKPOINTS = 4
#: Seconds of each ``ttl``.
TTL_S = {"5m": 300.0, "1h": 3600.0}


class CacheControl(BaseModel):
    """``cache_control``: ``{"type": "ephemeral", "ttl": "5m" | "1h"}``."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """Where a ``cache_control`` sits: the part (``tools``, ``system``, ``messages``, or
    ``request`` for the top-level one), the item's index and, in a message, the block's."""

    part: str
    index: int
    block: int
    ttl: str


def _control(raw: object, where: str) -> CacheControl | None:
    if raw is None:
        return None
    try:
        return parse_body(CacheControl, raw)
    except InvalidOptionError as exc:
        raise InvalidOptionError(f"{where}.cache_control: {exc}",
                                 option=f"{where}.cache_control") from None


def _extra(item: object) -> object:
    if isinstance(item, BaseModel):
        return (item.model_extra or {}).get("cache_control")
    return item.get("cache_control") if isinstance(item, Mapping) else None


def breakpoints(body: MessagesBody) -> list[Breakpoint]:
    """The request's breakpoints in Anthropic's order (checked: count and ttl order)."""
    found: list[Breakpoint] = []

    def add(raw: object, where: str, part: str, index: int, block: int = -1) -> None:
        control = _control(raw, where)
        if control is not None:
            found.append(Breakpoint(part, index, block, control.ttl))

    for i, tool in enumerate(body.tools or ()):
        add(_extra(tool), f"tools[{i}]", "tools", i)
    for i, text in enumerate(body.system if isinstance(body.system, list) else ()):
        add(_extra(text), f"system[{i}]", "system", i)
    for i, message in enumerate(body.messages):
        for j, raw in enumerate(message.content if isinstance(message.content, list) else ()):
            add(_extra(raw), f"messages[{i}].content[{j}]", "messages", i, j)
    add(body.cache_control, "request", "request", 0)
    _check(found)
    return found


def _check(found: list[Breakpoint]) -> None:
    if len(found) > MAX_BREAKPOINTS:
        raise InvalidOptionError(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(found)}.", option="cache_control")
    ttls = [point.ttl for point in found]
    if "5m" in ttls and "1h" in ttls[ttls.index("5m"):]:
        raise InvalidOptionError("a cache_control with ttl '1h' must not come after one with "
                                 "ttl '5m' (tools, then system, then messages)",
                                 option="cache_control")


def _truncated(body: MessagesBody, point: Breakpoint) -> MessagesBody:
    """``body`` without what comes after ``point``'s block."""
    tools = body.tools or None
    if point.part == "tools":
        return body.model_copy(update={"tools": (tools or [])[:point.index + 1],
                                       "system": None, "messages": []})
    if point.part == "system":
        system = body.system if isinstance(body.system, list) else []
        return body.model_copy(update={"system": system[:point.index + 1], "messages": []})
    message = body.messages[point.index]
    content = message.content if isinstance(message.content, list) else []
    last = message.model_copy(update={"content": content[:point.block + 1]})
    return body.model_copy(update={"messages": [*body.messages[:point.index], last]})


def _prefix_length(served: ServedModel, body: MessagesBody, point: Breakpoint,
                   token_ids: Sequence[int], to_chat: ToChat) -> int:
    """Tokens the rendering of ``body`` up to ``point`` shares with ``token_ids``."""
    if point.part == "request":
        return len(token_ids)
    try:
        request = to_chat(served, _truncated(body, point))
        messages, media = take_media(request.messages, served.limits, served.media_fetch)
        prompt = render_prompt(served, dataclasses.replace(request, messages=messages, extras={
            **request.extras, "add_generation_prompt": False, "continue_final_message": False}))
        tokens = served.tokenize_prompt(prompt, media)  # (its media encoded once already)
    except LlamapyError:
        return 0
    spans = token_ids.media if isinstance(token_ids, MediaPrompt) else ()
    return media_floor(spans, common_prefix(tokens, token_ids))


def cache_pins(served: ServedModel, body: MessagesBody, token_ids: Sequence[int],
               points: list[Breakpoint], to_chat: ToChat) -> tuple[tuple[int, float], ...]:
    """The ``cache_pins`` of ``points`` (from :func:`breakpoints`) in a Messages request whose
    prompt is ``token_ids``; ``to_chat`` renders a truncated body's chat request."""
    pins = []
    for point in points:
        length = _prefix_length(served, body, point, token_ids, to_chat)
        if length > 0:
            pins.append((length, TTL_S[point.ttl]))
    return tuple(pins)
