"""Chat building blocks: templates in, parsed messages out (pure Python, no model needed).

- :class:`ChatTemplate` renders a GGUF ``tokenizer.chat_template`` the way Hugging Face does.
- :class:`OutputParser` (built from protocol names such as ``["think", "hermes"]``) splits
  streamed output into content, reasoning and OpenAI-shaped tool calls.
"""

from llamapy.chat.delta import (
    Delta,
    ParsedMessage,
    ToolCall,
    ToolCallDelta,
    new_tool_call_id,
)
from llamapy.chat.messages_in import ToolArguments, normalize_messages, normalize_tools
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
from llamapy.chat.template import CHATML_TEMPLATE, ChatTemplate
from llamapy.chat.tool_calls import HERMES, LLAMA3_JSON, MISTRAL, ToolCallParser, ToolCallStyle

__all__ = [
    "CHATML_TEMPLATE",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "REASONING_PROTOCOLS",
    "TOOL_CALL_PROTOCOLS",
    "ChatTemplate",
    "Delta",
    "OutputParser",
    "ParsedMessage",
    "ReasoningParser",
    "ToolArguments",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolCallStyle",
    "new_tool_call_id",
    "normalize_messages",
    "normalize_tools",
    "prompt_opens_reasoning",
    "protocol_kind",
    "reasoning_parser",
    "tool_call_parser",
]
