"""Tools presented in the prompt for chat templates that do not render ``tools`` themselves."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["tool_instructions"]


def tool_instructions(tools: Sequence[Mapping[str, Any]]) -> str:
    """A system-prompt section presenting ``tools`` in Hermes style (the framing
    :mod:`llamapy.chat.tool_calls` parses back)."""
    listing = "\n".join(json.dumps(dict(tool), ensure_ascii=False) for tool in tools)
    return (
        "You may call one or more functions to assist with the user query. The available "
        f"functions are, as JSON schemas:\n<tools>\n{listing}\n</tools>\n"
        "To call a function, reply with a JSON object with its name and arguments inside "
        "<tool_call></tool_call> tags, like:\n<tool_call>\n"
        '{"name": "<function-name>", "arguments": {"<arg>": "<value>"}}\n</tool_call>'
    )
