"""Grammars that force a tool call, and the tool instructions for templates without tools.

With ``tool_choice`` ``"required"`` or a named function, generation is constrained to one call
in the model's own tool-call framing (Hermes ``<tool_call>``, Mistral ``[TOOL_CALLS]``, Llama 3
bare JSON), its ``arguments`` matching the function's ``parameters`` JSON schema, so even a
small model emits a valid call. With tools offered (``tool_choice`` ``"auto"``) the grammar is
lazy: text is free until the model opens a call (the protocol's trigger), and from there the
calls are constrained the same way, so a call always names a declared tool. Built on
:mod:`llamapy.grammar`'s schema converter.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import GrammarError, InvalidOptionError, UnsupportedFeatureError
from ..grammar.gbnf import GrammarBuilder, literal, sequence
from ..grammar.json_schema import SchemaConverter

#: Text around one call, by tool-call protocol.
log = logging.getLogger("llamapy.tools")

_FRAMES: dict[str, tuple[str, str, str]] = {
    # protocol: (before the object, after it, arguments key)
    "hermes": ("<tool_call>\n", "\n</tool_call>", "arguments"),
    "qwen": ("<tool_call>\n", "\n</tool_call>", "arguments"),
    "mistral": ("[TOOL_CALLS] [", "]", "arguments"),
    "llama3_json": ("", "", "parameters"),
}


#: Offered calls, by protocol: (trigger regex, text opening the calls, between two calls, text
#: closing them). A trigger is searched anywhere in the output (llama.cpp's lazy grammar), or,
#: written ``^...$``, matched against all of it with the grammar starting at its first group.
_OFFERED: dict[str, tuple[str, str, str, str]] = {
    "hermes": (r"<tool_call>", "<tool_call>", "</tool_call> <tool_call>", "</tool_call>"),
    "qwen": (r"<tool_call>", "<tool_call>", "</tool_call> <tool_call>", "</tool_call>"),
    "mistral": (r"\[TOOL_CALLS\]", "[TOOL_CALLS] [", ",", "]"),
    "llama3_json": (r'^\s*(\{\s*"name")[\s\S]*$', "", ";", ""),
}


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool.get("function") or {}


def call_schema(tool: Mapping[str, Any], arguments_key: str = "arguments") -> dict[str, Any]:
    """JSON schema of one call object of ``tool``: its name and schema-valid arguments."""
    function = _function(tool)
    parameters = function.get("parameters") or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": function.get("name")}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def select_tools(tools: Sequence[Mapping[str, Any]], choice: object) -> list[Mapping[str, Any]]:
    """The tools a forced choice allows: all for ``"required"``, one for a named function."""
    if choice == "required":
        return list(tools)
    name = choice.get("function", {}).get("name") if isinstance(choice, Mapping) else None
    chosen = [tool for tool in tools if _function(tool).get("name") == name]
    if not chosen:
        raise InvalidOptionError(f"tool_choice names {name!r}, which is not in tools",
                                 option="tool_choice")
    return chosen


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], choice: object,
                      protocol: str = "hermes") -> str:
    """GBNF for exactly one call of the tools ``choice`` allows, framed per ``protocol``."""
    before, after, arguments_key = _FRAMES.get(protocol, _FRAMES["hermes"])
    chosen = select_tools(tools, choice)
    schemas = [call_schema(tool, arguments_key) for tool in chosen]
    schema: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    builder = GrammarBuilder()
    call = SchemaConverter(builder).convert(schema, "call")
    parts = [part for part in (literal(before) if before else "", call,
                               literal(after) if after else "") if part]
    builder.define(builder.reserve("root"), sequence(*parts))
    return builder.render()


def _frame_parts(text: str, sep: str) -> list[str]:
    """The words of ``text`` as literals, each after optional whitespace (rule ``sep``)."""
    parts: list[str] = []
    for word in text.split():
        parts += [sep, literal(word)]
    return parts


def offered_grammar_or_none(tools: Sequence[Mapping[str, Any]], protocol: str
                            ) -> tuple[str, tuple[str, ...]] | None:
    """:func:`offered_tool_grammar`, or None when a tool's schema has no grammar (a format or
    bound the converter does not support): an offered tool stays usable, only unconstrained.
    Memoised by the tools' JSON (agents send the same tool list on every turn)."""
    try:
        return _offered_cached(json.dumps(tools, sort_keys=True, default=str), protocol)
    except (GrammarError, UnsupportedFeatureError, InvalidOptionError) as exc:
        log.info("offered tools left unconstrained: %s", exc)
        return None


@functools.lru_cache(maxsize=64)
def _offered_cached(tools_json: str, protocol: str) -> tuple[str, tuple[str, ...]]:
    return offered_tool_grammar(json.loads(tools_json), protocol)


def offered_tool_grammar(tools: Sequence[Mapping[str, Any]], protocol: str = "hermes"
                         ) -> tuple[str, tuple[str, ...]]:
    """The lazy grammar of ``tools`` offered, and its trigger patterns: once the model opens
    a call in ``protocol``'s framing, one or more calls of the declared tools follow (the
    name one of theirs, the arguments their schema's), whitespace-tolerant around the frame."""
    trigger, opening, between, closing = _OFFERED.get(protocol, _OFFERED["hermes"])
    arguments_key = _FRAMES.get(protocol, _FRAMES["hermes"])[2]
    schemas = [call_schema(tool, arguments_key) for tool in tools]
    schema: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    builder = GrammarBuilder()
    call = SchemaConverter(builder).convert(schema, "call")
    sep = builder.add("frame-space", "[ \\t\\n]*")
    more = sequence(*_frame_parts(between, sep), sep, call)
    body = sequence(*_frame_parts(opening, sep), sep, call, f"({more})*",
                    *_frame_parts(closing, sep))
    builder.define(builder.reserve("root"), body)
    return builder.render(), (trigger,)


def tool_instructions(tools: Sequence[Mapping[str, Any]]) -> str:
    """A system-prompt section presenting ``tools`` in Hermes style (for templates that do
    not render ``tools`` themselves)."""
    listing = "\n".join(json.dumps(dict(tool), ensure_ascii=False) for tool in tools)
    return (
        "You may call one or more functions to assist with the user query. The available "
        f"functions are, as JSON schemas:\n<tools>\n{listing}\n</tools>\n"
        "To call a function, reply with a JSON object with its name and arguments inside "
        "<tool_call></tool_call> tags, like:\n<tool_call>\n"
        '{"name": "<function-name>", "arguments": {"<arg>": "<value>"}}\n</tool_call>'
    )
