"""Ollama's native API on a served model: what ``/api/chat``, ``/api/generate``,
``/api/embed`` and the model endpoints of ``python -m llamapy.serve`` call.

- :func:`prepare_chat_request` / :func:`prepare_generate`: a request in Ollama's shape made
  into an :class:`OllamaPlan` through the OpenAI chat machinery (template, tools, reasoning,
  JSON-schema ``format``, options; see :mod:`.prompt` and :mod:`.options`).
- :func:`astream` / :func:`acomplete`: the NDJSON chunks of a plan, or the one final object
  (:mod:`.stream`).
- :func:`embed_inputs` / :func:`embed_response`: ``/api/embed`` (:mod:`.embed`).
- :mod:`.models`: ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``.

Errors are llamapy's typed errors (each with ``http_status``); the HTTP layer writes them in
Ollama's ``{"error": "..."}`` shape.
"""

from .embed import embed_inputs, embed_response
from .models import OLLAMA_API_VERSION, model_entry, refuse_model_op, show, version
from .options import engine_options, keep_alive, resolve_name, served_name, token_budget
from .params import (
    ChatBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    ModelOpBody,
    Options,
    ShowBody,
)
from .prompt import OllamaPlan, prepare_chat_request, prepare_generate
from .stream import OllamaStream, acomplete, astream, collect, created_at

__all__ = [
    "OLLAMA_API_VERSION",
    "ChatBody",
    "EmbedBody",
    "EmbeddingsBody",
    "GenerateBody",
    "ModelOpBody",
    "OllamaPlan",
    "OllamaStream",
    "Options",
    "ShowBody",
    "acomplete",
    "astream",
    "collect",
    "created_at",
    "embed_inputs",
    "embed_response",
    "engine_options",
    "keep_alive",
    "model_entry",
    "prepare_chat_request",
    "prepare_generate",
    "refuse_model_op",
    "resolve_name",
    "served_name",
    "show",
    "token_budget",
    "version",
]
