"""Output parsers by protocol name, and their composition into one :class:`OutputParser`.

A *parser protocol* is a name a request or a session config uses to say how the model marks
reasoning and tool calls: ``"think"`` (``<think>...</think>``), ``"hermes"`` (alias
``"qwen"``), ``"llama3_json"``, ``"mistral"``. An unknown name raises
:class:`~llamapy.errors.UnsupportedFeatureError` naming it.

:class:`OutputParser` runs the reasoning parser first and the tool-call parser on the answer
text it lets through; ``feed`` returns the :class:`Delta` to stream, ``flush`` the last one, and
``finish`` the :class:`ParsedMessage` that the deltas add up to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from llamapy.chat.delta import Delta, MessageBuilder, ParsedMessage, new_tool_call_id
from llamapy.chat.reasoning import ReasoningParser
from llamapy.chat.tool_calls import HERMES, LLAMA3_JSON, MISTRAL, ToolCallParser, ToolCallStyle
from llamapy.errors import InvalidOptionError, UnsupportedFeatureError

ProtocolKind = Literal["reasoning", "tool_calls"]

#: Reasoning protocols: name -> (start marker, end marker).
REASONING_PROTOCOLS: dict[str, tuple[str, str]] = {
    "think": ("<think>", "</think>"),
}

#: Tool-call protocols: name -> framing.
TOOL_CALL_PROTOCOLS: dict[str, ToolCallStyle] = {
    "hermes": HERMES,
    "qwen": HERMES,
    "llama3_json": LLAMA3_JSON,
    "mistral": MISTRAL,
}


def protocol_kind(name: str) -> ProtocolKind:
    """Whether ``name`` is a reasoning or a tool-call protocol; unknown names raise."""
    if name in REASONING_PROTOCOLS:
        return "reasoning"
    if name in TOOL_CALL_PROTOCOLS:
        return "tool_calls"
    known = ", ".join(sorted([*REASONING_PROTOCOLS, *TOOL_CALL_PROTOCOLS]))
    raise UnsupportedFeatureError(
        feature=name, message=f"unknown parser protocol {name!r} (known: {known})"
    )


def reasoning_parser(name: str, *, started: bool = False) -> ReasoningParser:
    """A fresh reasoning parser for protocol ``name``.

    ``started`` says the prompt already opened the reasoning block (the template ended with
    ``<think>``), so output begins inside it.
    """
    if protocol_kind(name) != "reasoning":
        raise InvalidOptionError(f"{name!r} is not a reasoning protocol", option=name)
    start, end = REASONING_PROTOCOLS[name]
    return ReasoningParser(start, end, started=started)


def prompt_opens_reasoning(prompt: str, name: str = "think") -> bool:
    """True when a rendered prompt ends inside an opened reasoning block.

    Some templates end the generation prompt with the start marker (DeepSeek-R1 writes
    ``<think>\n``); then the output starts inside reasoning: pass the result as
    ``reasoning_started``.
    """
    if protocol_kind(name) != "reasoning":
        raise InvalidOptionError(f"{name!r} is not a reasoning protocol", option=name)
    return prompt.rstrip().endswith(REASONING_PROTOCOLS[name][0])


def tool_call_parser(
    name: str, *, id_factory: Callable[[], str] = new_tool_call_id
) -> ToolCallParser:
    """A fresh tool-call parser for protocol ``name``."""
    if protocol_kind(name) != "tool_calls":
        raise InvalidOptionError(f"{name!r} is not a tool-call protocol", option=name)
    return ToolCallParser(TOOL_CALL_PROTOCOLS[name], id_factory=id_factory)


class OutputParser:
    """Reasoning parser, then tool-call parser; either may be absent."""

    def __init__(
        self,
        reasoning: ReasoningParser | None = None,
        tool_calls: ToolCallParser | None = None,
    ) -> None:
        self.reasoning = reasoning
        self.tool_calls = tool_calls
        self._builder = MessageBuilder()
        self._flushed = False

    @classmethod
    def from_protocols(
        cls,
        protocols: Iterable[str],
        *,
        reasoning_started: bool = False,
        id_factory: Callable[[], str] = new_tool_call_id,
    ) -> OutputParser:
        """Build from protocol names, at most one of each kind (``["think", "hermes"]``)."""
        names: dict[ProtocolKind, str] = {}
        for name in protocols:
            kind = protocol_kind(name)
            if kind in names:
                raise InvalidOptionError(
                    f"two {kind} protocols: {names[kind]!r} and {name!r}", option=name
                )
            names[kind] = name
        reasoning = names.get("reasoning")
        tools = names.get("tool_calls")
        return cls(
            reasoning=reasoning_parser(reasoning, started=reasoning_started) if reasoning else None,
            tool_calls=tool_call_parser(tools, id_factory=id_factory) if tools else None,
        )

    def feed(self, text: str) -> Delta:
        """Consume a chunk of generated text; return what to stream now."""
        if self._flushed:
            raise RuntimeError("feed() after flush()")
        first = self.reasoning.feed(text) if self.reasoning else Delta(content=text)
        return self._record(self._tool_stage(first, final=False))

    def flush(self) -> Delta:
        """End of generation: the last delta to stream (held-back text)."""
        if self._flushed:
            return Delta()
        self._flushed = True
        first = self.reasoning.flush() if self.reasoning else Delta()
        return self._record(self._tool_stage(first, final=True))

    def finish(self) -> ParsedMessage:
        """The whole message; flushes first if needed."""
        self.flush()
        return self._builder.build()

    def _tool_stage(self, delta: Delta, *, final: bool) -> Delta:
        if self.tool_calls is None:
            return delta
        out = Delta(reasoning=delta.reasoning)
        out.extend(self.tool_calls.feed(delta.content))
        if final:
            out.extend(self.tool_calls.flush())
        return out

    def _record(self, delta: Delta) -> Delta:
        self._builder.add(delta)
        return delta
