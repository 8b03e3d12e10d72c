"""A chat request rendered by llama.cpp's chat layer: prompt, grammar, triggers, stops, parser.

:func:`render` hands the conversation, the tools, ``tool_choice``, the JSON schema of
``response_format`` and the template controls to the chat layer (as llama-server does) and
returns a :class:`Rendered`: the prompt, the engine fields that make the format's tool calls
or JSON answer (grammar, lazy triggers, extra stops, the special tokens its markers use) and
the layer's :class:`~llamapy.server.chat_format.ChatParams` the output parser reads with.

Where llamapy differs from llama-server, on purpose:

- a named ``tool_choice`` forces a call of that function (the other tools are not offered);
- a template that knows no tools (``supports_tool_calls`` false: SmolLM2's, Gemma 2's, ...)
  gets them anyway: the tools are presented in the system message and calls are Hermes JSON in
  ``<tool_call>`` tags, forced by a grammar under ``tool_choice`` ``required`` (llama-server
  leaves such a model free to answer in text);
- tool and response schemas pass llamapy's bounded schema conversion first (depth, size), so
  no schema reaches the native converter that llamapy would not convert itself;
- a trigger pattern RE2 cannot run in linear time (a look-around) drops the lazy grammar: the
  output is free and still read for calls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..chat.layer import HERMES_TOOLS_TEMPLATE, source_templates
from ..chat.tool_prompt import tool_instructions
from ..errors import InvalidOptionError, LlamapyError
from ..grammar.json_schema import MAX_SCHEMA_DEPTH, schema_to_gbnf
from ..grammar.tool_calls import select_functions, tool_call_grammar
from ..options import check_reasoning_format
from ..options.triggers import compile_triggers
from ..server.chat_format import ChatParams, ChatTrigger
from .chat_request import ChatRequest
from .forced import call_at_once
from .params import ResponseFormat
from .target import ServedModel

__all__ = ["Rendered", "render"]

log = logging.getLogger("llamapy.chat")


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered chat request (see the module)."""

    prompt: str
    params: ChatParams
    fields: dict[str, Any]
    reasoning_format: str
    continuation: bool


def render(served: ServedModel, request: ChatRequest, *, continues: bool, add: bool
           ) -> Rendered:
    """Render ``request`` on ``served``'s templates (``continues``: the model goes on with the
    last assistant message; ``add``: a generation prompt is added)."""
    templates = served.chat_templates()
    fmt = check_reasoning_format(request.extra("reasoning_format", served.reasoning_format))
    caps = templates.caps
    inputs = _inputs(served, request, fmt, continues=continues, add=add,
                     thinking=templates.supports_enable_thinking)
    if inputs["parallel_tool_calls"] is None:
        inputs["parallel_tool_calls"] = caps.get("supports_parallel_tool_calls", False)
    native = caps.get("supports_tools", False) or caps.get("supports_tool_calls", False)
    if request.tools_active and not native:
        return _polyfilled(templates, inputs, fmt, continues)
    params = templates.apply(inputs)
    if request.tools_active and inputs["tool_choice"] == "required" and not params.grammar:
        return _polyfilled(templates, inputs, fmt, continues)  # never a free-text "call"
    forced = request.tools_active and inputs["tool_choice"] == "required"
    fields = _fields(served, params, forced, bool(inputs["parallel_tool_calls"]))
    return Rendered(params.prompt, params, fields, fmt, continues)


def _polyfilled(templates: Any, inputs: dict[str, Any], fmt: str, continues: bool
                ) -> Rendered:
    """A template without tools: the tools in its system message, calls in Hermes' format."""
    shown = dict(inputs, messages=_with_instructions(inputs["messages"], inputs["tools"]),
                 tools=[], tool_choice="auto")
    prompt = templates.apply(shown).prompt
    # the stand-in's params (grammar, parser, generation prompt) depend on the tools and the
    # prompt's end only: render the last message, not the whole conversation again
    params = source_templates(HERMES_TOOLS_TEMPLATE).apply(
        dict(inputs, messages=inputs["messages"][-1:]))
    fields = _grammar_fields(params)
    if inputs["tool_choice"] == "required":
        _calls_at_once(fields, inputs)
    return Rendered(prompt, params, fields, fmt, continues)


def _calls_at_once(fields: dict[str, Any], inputs: Mapping[str, Any]) -> None:
    """A forced call in the stand-in's framing from the first token (a small model would
    otherwise spend its budget on text first); llama.cpp's grammar (text, then calls) stays
    where llamapy's converter refuses a schema llama.cpp's reads."""
    try:
        grammar = tool_call_grammar(inputs["tools"], "required", "hermes",
                                    parallel=bool(inputs["parallel_tool_calls"]))
    except LlamapyError:
        return
    fields.pop("grammar_prefill", None)
    fields["grammar"] = grammar


def _with_instructions(messages: list[Any], tools: list[Any]) -> list[Any]:
    section = tool_instructions(tools)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        content = first.get("content") or ""
        if isinstance(content, list):
            content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        first["content"] = f"{content}\n\n{section}" if content else section
        return [first, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]


def _inputs(served: ServedModel, request: ChatRequest, fmt: str, *, continues: bool,
            add: bool, thinking: bool) -> dict[str, Any]:
    """The layer's inputs, as llama-server's ``oaicompat_chat_params_parse`` makes them:
    ``enable_thinking`` the template's own choice unless ``--reasoning`` or the request sets
    it, and the ``preserve_reasoning`` variable on unless they set it."""
    kwargs = request.extra("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise InvalidOptionError("chat_template_kwargs must be an object",
                                 option="chat_template_kwargs")
    variables = {"preserve_reasoning": True, **served.template_kwargs, **kwargs}
    tools, choice = _tools(request)
    inputs: dict[str, Any] = {
        "messages": [dict(m) for m in request.messages], "tools": tools,
        "tool_choice": choice, "json_schema": _schema_text(request),
        "add_generation_prompt": add and not continues,
        "parallel_tool_calls": request.parallel_tool_calls,
        "reasoning_format": fmt, "enable_thinking": _thinking(variables, thinking),
        "chat_template_kwargs": variables}
    if continues:
        explicit = request.extra("continue_final_message")
        inputs["continue_final_message"] = explicit if isinstance(explicit, str) else True
    return inputs


def _thinking(variables: Mapping[str, Any], default: bool) -> bool:
    flag = variables.get("enable_thinking", default)
    if not isinstance(flag, bool):
        raise InvalidOptionError("invalid type for \"enable_thinking\" (expected boolean)",
                                 option="chat_template_kwargs")
    return flag


def _tools(request: ChatRequest) -> tuple[list[dict[str, Any]], str]:
    """The tools offered and the layer's ``tool_choice`` (a named choice: that tool,
    required). Each tool's schema passes llamapy's bounded converter."""
    choice = request.tool_choice
    if not request.tools:
        if choice not in (None, "auto", "none"):
            raise InvalidOptionError("tool_choice needs tools", option="tool_choice")
        return [], "auto"
    if choice == "none":
        return [], "none"
    forced = choice not in (None, "auto")
    functions = select_functions([dict(t) for t in request.tools],
                                 choice if forced else "required")
    for function in functions:
        _check_bounded(function.get("parameters"))
    names = {f.get("name") for f in functions}
    tools = [dict(t) for t in request.tools
             if isinstance(t.get("function"), Mapping) and t["function"].get("name") in names]
    return tools, "required" if forced else "auto"


#: The most nodes of one tool's schema (objects, arrays and values together).
MAX_SCHEMA_NODES = 20_000


def _check_bounded(schema: Any) -> None:
    """Refuse a schema deeper than :data:`~llamapy.grammar.json_schema.MAX_SCHEMA_DEPTH` or
    larger than :data:`MAX_SCHEMA_NODES` before the native converter walks it (recursively)."""
    stack, nodes = [(schema, 0)], 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if depth > MAX_SCHEMA_DEPTH or nodes > MAX_SCHEMA_NODES:
            raise InvalidOptionError(
                f"a tool's parameters schema is deeper than {MAX_SCHEMA_DEPTH} or has more "
                f"than {MAX_SCHEMA_NODES} nodes", option="tools")
        children = value.values() if isinstance(value, Mapping) else (
            value if isinstance(value, list) else ())
        stack.extend((child, depth + 1) for child in children)


def _schema_text(request: ChatRequest) -> str:
    """The JSON schema of ``response_format`` or llama.cpp's ``json_schema`` field ("")."""
    fmt: ResponseFormat | None = request.response_format
    extra = request.extra("json_schema")
    schema: Any = None
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_schema" and fmt.json_schema is None:
            raise InvalidOptionError("response_format json_schema needs 'json_schema'",
                                     option="response_format.json_schema")
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else fmt.schema_
        schema = {"type": "object"} if schema is None or schema == {} else schema
        if extra is not None:
            raise InvalidOptionError("response_format and json_schema are exclusive",
                                     option="response_format")
    elif extra is not None:
        schema = extra
    if schema is None:
        return ""
    schema_to_gbnf(schema)  # bounded: depth, size, supported keywords
    return json.dumps(schema, ensure_ascii=False)


def _fields(served: ServedModel, params: ChatParams, forced: bool, parallel: bool
            ) -> dict[str, Any]:
    fields = _grammar_fields(params, forced=forced, parallel=parallel)
    if params.thinking_end_tags:  # what a reasoning budget watches (llama-server's)
        start = params.thinking_start_tag
        opened = start.strip() and params.generation_prompt.rstrip().endswith(start.strip())
        fields["reasoning_tags"] = ["" if opened else start, *params.thinking_end_tags]
    model = served.model
    preserved = [ids[0] for ids in (model.tokenize(text, False, True)
                                    for text in params.preserved_tokens) if len(ids) == 1]
    if preserved:
        fields["preserved_tokens"] = preserved
    return fields


def _grammar_fields(params: ChatParams, *, forced: bool = False, parallel: bool = False
                    ) -> dict[str, Any]:
    """The grammar (a forced call's starting at once: :func:`.forced.call_at_once`), its
    triggers when lazy, and the format's extra stops."""
    fields: dict[str, Any] = {}
    if params.additional_stops:
        fields["stop"] = list(params.additional_stops)
    if not params.grammar:
        return fields
    if not params.grammar_lazy:  # it reads the generation prompt first, as llama.cpp's does
        grammar = call_at_once(params, parallel=parallel) if forced else params.grammar
        fields["grammar"], fields["grammar_prefill"] = grammar, params.generation_prompt
        return fields
    patterns = [_pattern(t) for t in params.triggers]
    try:
        compile_triggers(patterns)
    except LlamapyError as exc:
        log.debug("lazy tool grammar left out: %s", exc)
        return fields
    fields["grammar"], fields["grammar_triggers"] = params.grammar, patterns
    return fields


def _pattern(trigger: ChatTrigger) -> str:
    """A trigger as the regex llama.cpp's sampler makes of it."""
    if trigger.kind == "pattern":
        return trigger.value
    if trigger.kind == "pattern_full":
        value = trigger.value
        return ("" if value.startswith("^") else "^") + value + (
            "" if value.endswith("$") else "$")
    return "".join(_literal(c) for c in trigger.value)


def _literal(char: str) -> str:
    """``char`` as a regex literal (RE2's syntax)."""
    if char in _METACHARS:
        return "\\" + char
    return char if char.isprintable() or ord(char) > 127 else f"\\x{ord(char):02x}"


_METACHARS = frozenset("\\.+*?()|[]{}^$")
