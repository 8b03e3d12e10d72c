"""The OpenAI-compatible HTTP server: ``python -m llamapy.serve`` or :func:`create_app`.

``python -m llamapy.serve [--model PATH] [--port 8080] [--api-key KEY] [--n-parallel 4] ...``
serves one model (the default one when ``--model`` is omitted); ``--help`` lists a flag for
every ``Server`` start option. Endpoints:

- OpenAI: ``POST /v1/chat/completions`` (tools, ``response_format``, logprobs, SSE streams),
  ``POST /v1/completions``, ``POST /v1/embeddings``, ``GET /v1/models``.
- llama-server: ``POST /completion``, ``/tokenize``, ``/detokenize``, ``/apply-template``,
  ``GET /props``, ``/slots``.
- Operations: ``GET /health`` (503 while loading; open without the API key), ``GET /metrics``
  (Prometheus, with the prompt-cache metrics), and a chat page at ``/``.

Every response of a generation carries the cache explanation: ``timings.cache_n``,
``cache_source`` and ``cache_diverged_at`` (and ``X-Llamapy-Cache-*`` headers), rounded or
hidden with ``--cache-report coarse|off`` (:mod:`llamapy.openai_api.cache_report`). The handlers
call the library functions of :mod:`llamapy.openai_api`, which also work without HTTP. API keys
may carry tenants (``--api-key-file`` lines ``KEY [TENANT [admin]]``, :mod:`.tenants`); what
each key sees is in :mod:`.tenant_view`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Lazy: ``python -m llamapy.serve`` starts loading the model before the HTTP stack is imported.
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'llamapy.serve' has no attribute {name!r}")
