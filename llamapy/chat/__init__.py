"""Chat building blocks: the deltas every API streams, and output parsers by protocol.

Templates are rendered and served output is read by llama.cpp's own chat layer
(:mod:`llamapy.chat.layer`). What stays here is pure Python (no model needed):

- :class:`Delta` and :class:`ParsedMessage`: a generation's content, reasoning and
  OpenAI-shaped tool calls, streamed and whole.
- :class:`OutputParser` (built from protocol names such as ``["think", "hermes"]``) splits
  streamed output into content, reasoning and tool calls (a session's ``parser_protocols``).
- :data:`CHATML_TEMPLATE`: plain ChatML's Jinja source (llama.cpp's built-in ``chatml``).
"""

from llamapy.chat.builtin_templates import CHATML_TEMPLATE
from llamapy.chat.delta import (
    Delta,
    ParsedMessage,
    ToolCall,
    ToolCallDelta,
    new_tool_call_id,
)
from llamapy.chat.parsers import (
    REASONING_PROTOCOLS,
    TOOL_CALL_PROTOCOLS,
    OutputParser,
    prompt_opens_reasoning,
    protocol_kind,
    reasoning_parser,
    tool_call_parser,
)
from llamapy.chat.reasoning import ReasoningParser
from llamapy.chat.tool_calls import HERMES, LLAMA3_JSON, MISTRAL, ToolCallParser, ToolCallStyle

__all__ = [
    "CHATML_TEMPLATE",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "REASONING_PROTOCOLS",
    "TOOL_CALL_PROTOCOLS",
    "Delta",
    "OutputParser",
    "ParsedMessage",
    "ReasoningParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolCallStyle",
    "new_tool_call_id",
    "prompt_opens_reasoning",
    "protocol_kind",
    "reasoning_parser",
    "tool_call_parser",
]
