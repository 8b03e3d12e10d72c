"""Tool-call grammars: a forced call, and the lazy grammar of tools offered.

Calls are written in the framing the model's chat template teaches (its *protocol*, the one
:mod:`llamapy.chat.tool_calls` parses back), each call's arguments constrained by the
function's ``parameters`` JSON schema, so even a small model emits a valid call:

- ``hermes`` (and ``qwen``): ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``
- ``mistral``: ``[TOOL_CALLS] [{"name": "f", "arguments": {...}}]``
- ``llama3_json``: ``{"name": "f", "parameters": {...}}``

:func:`tool_call_grammar` forces a call (``tool_choice`` ``required`` or a named function; one
call, or one or more with ``parallel``). :func:`offered_tool_grammar` is lazy (``tool_choice``
``auto``): text is free until the model opens a call (the protocol's trigger pattern), and from
there one or more calls of the declared tools follow, so a call always names one of them.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from llamapy.errors import GrammarError, InvalidOptionError, UnsupportedFeatureError
from llamapy.grammar.gbnf import GrammarBuilder, literal, repeat, sequence
from llamapy.grammar.json_schema import SchemaConverter

__all__ = ["call_schema", "chosen_function", "offered_grammar_or_none",
           "offered_tool_grammar", "select_functions", "tool_call_grammar"]

log = logging.getLogger("llamapy.tools")

#: protocol -> (text before the first call, between two calls, after the last, arguments key)
_FRAMES: dict[str, tuple[str, str, str, str]] = {
    "hermes": ("<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>", "arguments"),
    "qwen": ("<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>", "arguments"),
    "mistral": ("[TOOL_CALLS] [", ", ", "]", "arguments"),
    "llama3_json": ("", "; ", "", "parameters"),
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


#: The arguments of a function that declares no ``parameters``: none (``{}``).
_NO_PARAMETERS = {"type": "object", "properties": {}}


def _frames(protocol: str) -> tuple[str, str, str, str]:
    frames = _FRAMES.get(protocol)
    if frames is None:
        raise UnsupportedFeatureError(
            feature=protocol, message=f"tool call protocol {protocol!r} (known: "
                                      f"{', '.join(_FRAMES)})")
    return frames


def _functions(tools: Sequence[Any]) -> list[Mapping[str, Any]]:
    """Each tool's ``function`` (:class:`InvalidOptionError` for a tool that is not a named
    function, or for no tools)."""
    if not tools:
        raise InvalidOptionError("tool_choice requires tools", option="tools")
    functions = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidOptionError(f"tools[{index}] is not a function tool", option="tools")
        functions.append(function)
    return functions


def call_schema(function: Mapping[str, Any], arguments_key: str = "arguments"
                ) -> dict[str, Any]:
    """JSON schema of one call object of ``function`` (a tool's ``function``): its name and
    schema-valid arguments."""
    parameters = function.get("parameters") or _NO_PARAMETERS
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def chosen_function(tool_choice: Any) -> str | None:
    """The function name a forcing ``tool_choice`` names (OpenAI's ``{"function": {"name"}}``
    or the Responses API's ``{"name"}``), None for ``"required"``; anything else (``"auto"``,
    ``"none"`` included) is an :class:`InvalidOptionError`."""
    if tool_choice == "required":
        return None
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function", tool_choice)
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str):
            return name
    raise InvalidOptionError(f"tool_choice {tool_choice!r} is not valid", option="tool_choice")


def select_functions(tools: Sequence[Any], tool_choice: Any) -> list[Mapping[str, Any]]:
    """The functions of the tools a forcing ``tool_choice`` allows: all for ``"required"``,
    the named one otherwise (:class:`InvalidOptionError` when there is none)."""
    functions = _functions(tools)
    name = chosen_function(tool_choice)
    chosen = [f for f in functions if name is None or f["name"] == name]
    if not chosen:
        raise InvalidOptionError(f"tool_choice names {name!r}, which is not in tools",
                                 option="tool_choice")
    return chosen


def _call_rule(builder: GrammarBuilder, functions: Sequence[Mapping[str, Any]], key: str
               ) -> str:
    """The rule of one call object of any of ``functions``."""
    schemas = [call_schema(function, key) for function in functions]
    schema: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return SchemaConverter(builder).convert(schema, "call")


def tool_call_grammar(tools: Sequence[Any], tool_choice: Any = "required",
                      protocol: str = "hermes", *, parallel: bool = False) -> str | None:
    """GBNF forcing a call of the tools ``tool_choice`` allows, framed per ``protocol`` (one
    call; one or more with ``parallel``); None for ``"auto"``, ``"none"`` and None, which
    force nothing."""
    if tool_choice in ("auto", "none", None):
        return None
    before, between, after, key = _frames(protocol)
    builder = GrammarBuilder()
    call = _call_rule(builder, select_functions(tools, tool_choice), key)
    more = repeat(sequence(literal(between), call), 0, None) if parallel else ""
    parts = [part for part in (literal(before) if before else "", call, more,
                               literal(after) if after else "") if part]
    builder.define(builder.reserve("root"), sequence(*parts))
    return builder.render()


def _frame_parts(text: str, sep: str) -> list[str]:
    """The words of ``text`` as literals, each after optional whitespace (rule ``sep``)."""
    parts: list[str] = []
    for word in text.split():
        parts += [sep, literal(word)]
    return parts


def offered_tool_grammar(tools: Sequence[Any], protocol: str = "hermes"
                         ) -> tuple[str, tuple[str, ...]]:
    """The lazy grammar of ``tools`` offered, and its trigger patterns: once the model opens
    a call in ``protocol``'s framing, one or more calls of the declared tools follow (the
    name one of theirs, the arguments their schema's), whitespace-tolerant around the frame."""
    key = _frames(protocol)[3]
    trigger, opening, between, closing = _OFFERED[protocol]
    builder = GrammarBuilder()
    call = _call_rule(builder, _functions(tools), key)
    sep = builder.add("frame-space", "[ \\t\\n]*")
    more = sequence(*_frame_parts(between, sep), sep, call)
    body = sequence(*_frame_parts(opening, sep), sep, call, f"({more})*",
                    *_frame_parts(closing, sep))
    builder.define(builder.reserve("root"), body)
    return builder.render(), (trigger,)


def offered_grammar_or_none(tools: Sequence[Any], protocol: str
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
