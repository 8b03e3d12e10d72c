"""One decode pass of a session: sampling parameters, output parsing, structured output."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from llamapy.chat.delta import ToolCall, new_tool_call_id
from llamapy.chat.parsers import OutputParser, prompt_opens_reasoning, protocol_kind
from llamapy.engine.options import SamplingParams
from llamapy.errors import InvalidOptionError
from llamapy.grammar.json_schema import schema_to_gbnf
from llamapy.session.config import DecodeConfig, StreamChunk, decode_sampling

__all__ = ["DecodeRun"]


class DecodeRun:
    """Turns a :class:`DecodeConfig` into sampling parameters and engine text into chunks.

    Raises at construction (before anything is submitted): ``UnsupportedFeatureError`` for an
    unknown parser protocol, ``InvalidOptionError`` / ``GrammarError`` for bad values.
    ``prompt_tail`` is the text the resident tokens end with: when it ends with the reasoning
    protocol's start marker (a suffix that opens ``<think>``), output begins inside reasoning.
    """

    def __init__(self, config: DecodeConfig, defaults: SamplingParams,
                 prompt_tail: str = "") -> None:
        self.config = config
        self.tool_json = config.structured_output.kind == "json_schema_tool_calls"
        self.sampling = self._sampling(config, defaults)
        protocols = list(config.parser_protocols)
        for name in protocols:
            protocol_kind(name)  # unknown names raise UnsupportedFeatureError
        if config.reasoning_format == "none":
            protocols = [p for p in protocols if protocol_kind(p) != "reasoning"]
        started = any(protocol_kind(p) == "reasoning" and prompt_opens_reasoning(prompt_tail, p)
                      for p in protocols)
        self.parser = OutputParser.from_protocols(protocols, reasoning_started=started)
        self._json: list[str] = []

    @staticmethod
    def _sampling(config: DecodeConfig, defaults: SamplingParams) -> SamplingParams:
        changes: dict[str, Any] = decode_sampling(config)
        structured = config.structured_output
        if structured.kind == "grammar":
            changes["grammar"] = structured.grammar
        elif structured.kind != "none":
            assert structured.schema is not None
            changes["grammar"] = schema_to_gbnf(structured.schema)
        return replace(defaults, **changes)

    def feed(self, text: str) -> StreamChunk | None:
        """A chunk for newly released text, None when there is nothing to stream."""
        if not text:
            return None
        if self.tool_json:
            self._json.append(text)
            return None
        delta = self.parser.feed(text)
        if not (delta.content or delta.reasoning):
            return None
        return StreamChunk(text=delta.content, thinking=delta.reasoning)

    def finish(self, finish_reason: str) -> StreamChunk:
        """The last chunk: held-back text and the finished tool calls."""
        if self.tool_json:
            return StreamChunk(tool_calls=_json_tool_calls("".join(self._json)),
                               finish_reason=finish_reason)
        delta = self.parser.flush()
        message = self.parser.finish()
        return StreamChunk(text=delta.content, thinking=delta.reasoning,
                           tool_calls=message.tool_calls, finish_reason=finish_reason)


def _json_tool_calls(text: str) -> tuple[ToolCall, ...]:
    """Tool calls from constrained JSON: ``{"name", "arguments"}`` or a list of them."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidOptionError(f"constrained output is not JSON: {exc}",
                                 option="structured_output") from exc
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidOptionError("tool-call JSON needs a string 'name'",
                                     option="structured_output")
        arguments = item.get("arguments", {})
        calls.append(ToolCall(id=new_tool_call_id(), name=item["name"],
                              arguments=json.dumps(arguments)))
    return tuple(calls)
