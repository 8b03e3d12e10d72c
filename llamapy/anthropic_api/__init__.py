"""The Anthropic Messages API on a ``Server`` (or a ``Model``): what ``/v1/messages`` calls.

- :func:`create_message` / :func:`stream_message` (and ``a*`` asyncio forms): system prompts,
  content blocks (text, tool use and results, thinking), stop sequences, tools with forced
  choice under a grammar, thinking blocks from the parsed reasoning, usage with
  ``cache_read_input_tokens``.
- :func:`count_message_tokens`: ``count_tokens``.

Requests are dicts in Anthropic's shape, translated into OpenAI chat requests and run by the
same machinery as :mod:`llamapy.openai_api` (see :mod:`.prompt`); errors are llamapy's typed
errors (each with ``http_status``).
"""

from .blocks import BlockBuilder
from .messages import acreate_message, count_message_tokens, create_message, message_response
from .params import MessagesBody
from .prompt import MessagesPlan, chat_request, prepare_messages
from .stream import MessageStream, astream_message, stream_message

__all__ = [
    "BlockBuilder",
    "MessageStream",
    "MessagesBody",
    "MessagesPlan",
    "acreate_message",
    "astream_message",
    "chat_request",
    "count_message_tokens",
    "create_message",
    "message_response",
    "prepare_messages",
    "stream_message",
]
