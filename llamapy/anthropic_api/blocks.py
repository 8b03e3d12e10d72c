"""Content blocks of an Anthropic message, built from the output parser's deltas.

:class:`BlockBuilder` is the one place that decides the blocks: a streamed response sends the
events :meth:`BlockBuilder.add` returns, a whole response uses :attr:`BlockBuilder.blocks`
after feeding it the whole output, so both agree. Blocks open one at a time with increasing
``index``: ``thinking`` (the parsed reasoning), ``text`` and one ``tool_use`` per call; a new
kind of output closes the open block. A thinking block gets a ``signature``: an opaque digest
of its text (nothing verifies it; it only has to be there and stable).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from ..chat import Delta, ToolCallDelta

ANTHROPIC_TOOL_PREFIX = "toolu_"


def tool_use_id(call_id: str) -> str:
    """The ``toolu_...`` id of a parsed call (``call_...``)."""
    _, _, suffix = call_id.partition("_")
    return ANTHROPIC_TOOL_PREFIX + (suffix or call_id)


def signature(thinking: str) -> str:
    """The ``signature`` of a thinking block."""
    return hashlib.sha256(thinking.encode("utf-8")).hexdigest()


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the ``input`` object (``{}`` when they are not a JSON object)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _delta_event(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


class BlockBuilder:
    """Turns parser deltas into content blocks and the stream events that build them."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._open = False
        self._arguments = ""

    @property
    def has_tool_use(self) -> bool:
        """Whether the answer called a tool."""
        return any(block["type"] == "tool_use" for block in self.blocks)

    @property
    def _index(self) -> int:
        return len(self.blocks) - 1

    def _current(self, kind: str) -> bool:
        return self._open and self.blocks[-1]["type"] == kind

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.finish()
        self.blocks.append(block)
        self._open = True
        events.append({"type": "content_block_start", "index": self._index,
                       "content_block": copy.deepcopy(block)})
        return events

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if not self._current(kind):
            start: dict[str, Any] = {"type": kind, kind: ""}
            if kind == "thinking":
                start["signature"] = ""
            events = self._start(start)
        self.blocks[-1][kind] += text
        events.append(_delta_event(self._index, {"type": f"{kind}_delta", kind: text}))
        return events

    def _tool(self, piece: ToolCallDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if piece.id is not None:
            events = self._start({"type": "tool_use", "id": tool_use_id(piece.id),
                                  "name": piece.name or "", "input": {}})
            self._arguments = ""
        if piece.arguments and self._current("tool_use"):
            self._arguments += piece.arguments
            events.append(_delta_event(self._index, {"type": "input_json_delta",
                                                     "partial_json": piece.arguments}))
        return events

    def add(self, delta: Delta) -> list[dict[str, Any]]:
        """Account for one parser delta; return the stream events it makes."""
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            events += self._text("thinking", delta.reasoning)
        if delta.content:
            events += self._text("text", delta.content)
        for piece in delta.tool_call_deltas:
            events += self._tool(piece)
        return events

    def finish(self) -> list[dict[str, Any]]:
        """Close the open block (a thinking block gets its ``signature_delta`` first)."""
        if not self._open:
            return []
        self._open = False
        block, events = self.blocks[-1], []
        if block["type"] == "thinking":
            block["signature"] = signature(block["thinking"])
            events.append(_delta_event(self._index, {"type": "signature_delta",
                                                     "signature": block["signature"]}))
        elif block["type"] == "tool_use":
            block["input"] = tool_input(self._arguments)
        events.append({"type": "content_block_stop", "index": self._index})
        return events
