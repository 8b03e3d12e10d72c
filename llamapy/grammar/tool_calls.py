"""The grammar of a forced tool call, and the functions a forcing ``tool_choice`` allows.

Calls are written in Hermes' framing, the one a template without tools is given (llama.cpp's
chat layer reads them back with the Hermes stand-in format of :mod:`llamapy.chat.layer`)::

    <tool_call>
    {"name": "f", "arguments": {...}}
    </tool_call>

Each call's arguments are constrained by the function's ``parameters`` JSON schema, so even a
small model emits a valid call. :func:`tool_call_grammar` forces a call (``tool_choice``
``required`` or a named function; one call, or one or more with ``parallel``);
:func:`select_functions` and :func:`chosen_function` read a forcing ``tool_choice``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llamapy.errors import InvalidOptionError, UnsupportedFeatureError
from llamapy.grammar.gbnf import GrammarBuilder, literal, repeat, sequence
from llamapy.grammar.json_schema import SchemaConverter

__all__ = ["call_schema", "chosen_function", "select_functions", "tool_call_grammar"]

#: protocol -> (text before the first call, between two calls, after the last, arguments key)
_FRAMES: dict[str, tuple[str, str, str, str]] = {
    "hermes": ("<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>", "arguments"),
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
    more = [repeat(sequence(literal(between), call), 0, None)] if parallel else []
    builder.define(builder.reserve("root"), sequence(literal(before), call, *more,
                                                     literal(after)))
    return builder.render()
