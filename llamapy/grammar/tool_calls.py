"""A grammar that forces a valid tool call (``tool_choice`` ``required`` or a named function).

The call is written in the model family's own format (the one its chat template teaches and
:mod:`llamapy.chat.tool_calls` parses back), with the arguments constrained by the function's
``parameters`` schema:

- ``hermes``: ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``
- ``llama3_json``: ``{"name": "f", "parameters": {...}}``
- ``mistral``: ``[TOOL_CALLS] [{"name": "f", "arguments": {...}}]``

With ``parallel=True`` one or more calls are allowed (newline-separated, or more array entries
for Mistral). ``tool_choice`` ``"auto"`` and ``"none"`` need no grammar: the result is ``None``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llamapy.errors import InvalidOptionError, UnsupportedFeatureError
from llamapy.grammar.gbnf import GrammarBuilder, alternatives, literal, repeat, sequence
from llamapy.grammar.json_schema import SchemaConverter

#: style -> (text before the calls, before a call's name, after the name, after the arguments,
#: between two calls, after the calls)
_FRAMES: dict[str, tuple[str, str, str, str, str, str]] = {
    "hermes": ("", '<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>", "\n", ""),
    "llama3_json": ("", '{"name": "', '", "parameters": ', "}", "; ", ""),
    "mistral": ("[TOOL_CALLS] [", '{"name": "', '", "arguments": ', "}", ", ", "]"),
}
TOOL_CALL_STYLES = tuple(_FRAMES)
_NO_PARAMETERS = {"type": "object", "properties": {}}


def _function(tool: Any, index: int) -> Mapping[str, Any]:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InvalidOptionError(f"tools[{index}] is not a function tool", option="tools")
    return function


def chosen_function(tool_choice: Any) -> str | None:
    """The function name a ``tool_choice`` forces, ``None`` for ``"required"``.

    Raises :class:`InvalidOptionError` for ``"auto"``/``"none"`` and malformed values.
    """
    if tool_choice == "required":
        return None
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function", tool_choice)
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str):
            return name
    raise InvalidOptionError(f"tool_choice {tool_choice!r} is not valid", option="tool_choice")


def tool_call_grammar(
    tools: Sequence[Mapping[str, Any]],
    tool_choice: Any = "required",
    *,
    style: str = "hermes",
    parallel: bool = False,
) -> str | None:
    """GBNF forcing a call to one of ``tools`` (OpenAI shape), or ``None`` when not forced."""
    if tool_choice in ("auto", "none", None):
        return None
    if style not in _FRAMES:
        raise UnsupportedFeatureError(
            feature=style, message=f"tool call style {style!r} (known: {TOOL_CALL_STYLES})"
        )
    functions = [_function(tool, index) for index, tool in enumerate(tools)]
    forced = chosen_function(tool_choice)
    if forced is not None:
        functions = [f for f in functions if f["name"] == forced]
        if not functions:
            raise InvalidOptionError(
                f"tool_choice names unknown function {forced!r}", option="tool_choice"
            )
    if not functions:
        raise InvalidOptionError("tool_choice requires at least one tool", option="tools")
    converter = SchemaConverter(GrammarBuilder())
    calls = [_call_rule(converter, function, style) for function in functions]
    call = converter.builder.add("call", alternatives(*calls))
    before, _, _, _, between, after = _FRAMES[style]
    more = repeat(sequence(literal(between), call), 0, None) if parallel else ""
    root = converter.builder.reserve("root")
    converter.builder.define(root, sequence(_lit(before), call, more, _lit(after)))
    return converter.builder.render()


def _lit(text: str) -> str:
    return literal(text) if text else ""


def _call_rule(converter: SchemaConverter, function: Mapping[str, Any], style: str) -> str:
    _, open_name, after_name, close, _, _ = _FRAMES[style]
    name = function["name"]
    parameters = function.get("parameters") or _NO_PARAMETERS
    arguments = converter.convert(parameters, f"{name}-arguments")
    spelled = json.dumps(name, ensure_ascii=False)[1:-1]
    body = sequence(literal(open_name + spelled + after_name), arguments, literal(close))
    return converter.builder.add(f"{name}-call", body)
