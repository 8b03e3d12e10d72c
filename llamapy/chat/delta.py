"""What the output parsers produce: streaming deltas and the final parsed message.

Shapes follow the OpenAI chat API: a finished :class:`ToolCall` is
``{"id", "type": "function", "function": {"name", "arguments"}}`` with ``arguments`` a JSON
string; a :class:`ToolCallDelta` is one streamed piece of it (the first piece of a call carries
its ``index``, ``id`` and ``name``, later pieces only argument text). A :class:`ParsedMessage` is
exactly what the deltas add up to, so streamed and non-streamed answers agree.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Any

_ID_ALPHABET = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    """A fresh OpenAI-style tool call id: ``call_`` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A complete tool call; ``arguments`` is JSON text."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallDelta:
    """One streamed piece of the tool call at ``index``; ``id``/``name`` only on the first."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The piece as an entry of a chunk's ``delta.tool_calls``."""
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.name is not None:
            function["name"] = self.name
        out: dict[str, Any] = {"index": self.index, "function": function}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        return out


@dataclass(slots=True)
class Delta:
    """What one ``feed`` added: visible text, reasoning text and tool-call pieces."""

    content: str = ""
    reasoning: str = ""
    tool_call_deltas: list[ToolCallDelta] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when the feed produced nothing to send."""
        return not (self.content or self.reasoning or self.tool_call_deltas)

    def extend(self, other: Delta) -> None:
        """Append ``other`` to this delta."""
        self.content += other.content
        self.reasoning += other.reasoning
        self.tool_call_deltas.extend(other.tool_call_deltas)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedMessage:
    """A finished assistant message: ``None`` where a part is absent, as OpenAI reports it."""

    content: str | None
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI ``choices[0].message``."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return out


class MessageBuilder:
    """Adds up deltas into a :class:`ParsedMessage`."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[dict[str, Any]] = []

    def add(self, delta: Delta) -> None:
        """Account for one delta."""
        self._content.append(delta.content)
        self._reasoning.append(delta.reasoning)
        for piece in delta.tool_call_deltas:
            if piece.index == len(self._calls):
                self._calls.append({"id": piece.id, "name": piece.name, "arguments": ""})
            self._calls[piece.index]["arguments"] += piece.arguments

    def build(self) -> ParsedMessage:
        """The message the deltas so far add up to."""
        content = "".join(self._content)
        reasoning = "".join(self._reasoning)
        calls = tuple(
            ToolCall(id=call["id"], name=call["name"], arguments=call["arguments"])
            for call in self._calls
        )
        return ParsedMessage(
            content=content if content or not calls else None,
            reasoning_content=reasoning or None,
            tool_calls=calls,
        )
