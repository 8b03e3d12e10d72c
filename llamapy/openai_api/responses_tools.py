"""The ``tools`` of a Responses request, as the model is offered them.

- A ``function`` tool is offered as it is.
- A ``namespace`` tool (``{"type": "namespace", "name", "description", "tools": [...]}``,
  as Codex groups its sub-agent tools) is offered as its functions, each named
  ``<namespace>.<function>`` (:data:`SEPARATOR`), its description led by the namespace's. A
  call the model makes to one comes back as a ``function_call`` item with ``name`` the
  function's own and ``namespace`` set (:class:`Namespaces`), as OpenAI returns it; a
  ``function_call`` input item with a ``namespace`` is rendered under the same joined name, so
  a conversation sent back reuses its cached tokens.
- A hosted tool (:data:`HOSTED`: ``web_search``, ``file_search``, ``code_interpreter``, …)
  runs on OpenAI's side; this server runs none, so such an entry is accepted and not offered
  (the response echoes ``tools`` as sent); a ``tool_choice`` naming one is a 400.
- Any other type (``custom`` included) is a 400 naming the entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import InvalidOptionError, UnsupportedFeatureError
from .params import parse_body
from .responses_params import FunctionTool

#: Joins a namespace and a function into the name the model sees.
SEPARATOR = "."

#: Tools OpenAI runs itself: accepted in ``tools`` and not offered to the model.
HOSTED = frozenset({
    "web_search", "web_search_preview", "web_search_2025_08_26",
    "web_search_preview_2025_03_11", "file_search", "code_interpreter", "image_generation",
    "computer_use_preview", "computer_use", "mcp", "local_shell", "shell", "apply_patch",
    "tool_search",
})

#: The most functions one namespace may hold.
MAX_NAMESPACE_TOOLS = 128


class NamespaceTool(BaseModel):
    """``{"type": "namespace", "name", "description", "tools": [function, ...]}``."""

    model_config = ConfigDict(defer_build=True, extra="allow")

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    tools: list[dict[str, Any]] = Field(max_length=MAX_NAMESPACE_TOOLS)


@dataclass(frozen=True)
class Namespaces:
    """Which offered names are a namespace's functions: joined name -> (namespace, name)."""

    joined: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def split(self, name: str) -> tuple[str, str | None]:
        """A called name as the output item's ``name`` and ``namespace``."""
        parts = self.joined.get(name)
        return (parts[1], parts[0]) if parts else (name, None)


def joined_name(namespace: str | None, name: str) -> str:
    """The name the model sees for ``name`` in ``namespace``."""
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


def _where_type(raw: object, where: str) -> str:
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if not isinstance(kind, str):
        raise InvalidOptionError(f"{where} must be an object with a 'type'", option=where)
    return kind


def _function(raw: object, where: str) -> FunctionTool:
    kind = _where_type(raw, where)
    if kind != "function":
        raise UnsupportedFeatureError(kind, f"{where}: tool type {kind!r} is not supported "
                                            "(supported: function, namespace; hosted tools "
                                            "are not offered)")
    try:
        return parse_body(FunctionTool, raw)
    except InvalidOptionError as exc:
        raise InvalidOptionError(f"{where}: {exc}", option=where) from None


def _namespace(raw: object, where: str) -> list[tuple[FunctionTool, str]]:
    try:
        space = parse_body(NamespaceTool, raw)
    except InvalidOptionError as exc:
        raise InvalidOptionError(f"{where}: {exc}", option=where) from None
    lead = f"[{space.description}] " if space.description else ""
    tools = [_function(child, f"{where}.tools[{i}]") for i, child in enumerate(space.tools)]
    return [(tool.model_copy(update={"name": joined_name(space.name, tool.name),
                                     "description": lead + (tool.description or "") or None}),
             space.name) for tool in tools]


def offered_tools(raw_tools: Sequence[object] | None) -> tuple[list[FunctionTool], Namespaces]:
    """The functions ``tools`` offers the model, and its namespaces' joined names."""
    tools: list[FunctionTool] = []
    joined: dict[str, tuple[str, str]] = {}
    for index, raw in enumerate(raw_tools or ()):
        where = f"tools[{index}]"
        kind = _where_type(raw, where)
        if kind == "namespace":
            for tool, space in _namespace(raw, where):
                joined[tool.name] = (space, tool.name[len(space) + len(SEPARATOR):])
                tools.append(tool)
        elif kind not in HOSTED:
            tools.append(_function(raw, where))
    return tools, Namespaces(joined)
