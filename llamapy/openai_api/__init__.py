"""OpenAI-shaped library functions on a ``Server`` (or a ``Model``): what the HTTP layer calls.

- :func:`chat_completion` / :func:`stream_chat_completion` (and ``a*`` asyncio forms): chat
  templates, tools (forced calls under a grammar), ``response_format``, reasoning, logprobs,
  usage with ``prompt_tokens_details.cached_tokens``, and ``timings`` explaining prefix reuse.
- :func:`completion` / :func:`stream_completion` (and ``a*``): text completions.
- :func:`create_response` / :func:`stream_response` (and ``a*``): the Responses API, built on
  the chat machinery (see :mod:`.bridge`); :func:`count_input_tokens` and
  :func:`count_chat_input_tokens` count prompts without generating.

``target`` is a :class:`~llamapy.server.Server`, a :class:`~llamapy.server.Model` (run
through a private single-slot server) or a :class:`ServedModel` (a server with a public name,
template override and timeout). Requests are dicts in the OpenAI shape; errors are llamapy's
typed errors (each with ``http_status``).
"""

from .chat import (
    ChatStream,
    achat_completion,
    astream_chat_completion,
    chat_completion,
    chat_response,
    stream_chat_completion,
)
from .chat_request import ChatRequest
from .completions import (
    acompletion,
    astream_completion,
    completion,
    stream_completion,
)
from .params import ENGINE_ALIASES, ChatBody, CompletionBody
from .prompt import ChatPlan, prepare_chat, prepare_request
from .responses import (
    ResponseStream,
    acreate_response,
    astream_response,
    count_chat_input_tokens,
    count_input_tokens,
    create_response,
    stream_response,
)
from .responses_input import ResponsesPlan, prepare_responses
from .target import ServedModel, served

__all__ = [
    "ENGINE_ALIASES",
    "ChatBody",
    "ChatPlan",
    "ChatRequest",
    "ChatStream",
    "CompletionBody",
    "ResponseStream",
    "ResponsesPlan",
    "ServedModel",
    "achat_completion",
    "acompletion",
    "acreate_response",
    "astream_chat_completion",
    "astream_completion",
    "astream_response",
    "chat_completion",
    "chat_response",
    "completion",
    "count_chat_input_tokens",
    "count_input_tokens",
    "create_response",
    "prepare_chat",
    "prepare_request",
    "prepare_responses",
    "served",
    "stream_chat_completion",
    "stream_completion",
    "stream_response",
]
