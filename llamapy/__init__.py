"""llamapy: serve llama.cpp models from Python.

- :class:`Server` — continuous batching over one model, sync and asyncio API.
- :class:`ModelManager` — many models, each its own ``Server``, loaded on demand under a budget.
- :class:`Session` — a workspace session: a stable prefix kept hot on a leased slot
  (``server.open_session(SessionConfig(...))``, or :func:`open_standalone` on a model), with
  :class:`SessionConfig`, :class:`DecodeConfig`, :class:`PrefixInput`, :class:`SuffixInput`.
- :class:`Completion` (with :class:`Usage` and a :class:`FinishReason`) — a finished request.
- :mod:`llamapy.errors` — the one exception tree under :class:`LlamapyError`.
- :mod:`llamapy.engine` — the backend-agnostic scheduling core (with a ``FakeBackend``).
- :mod:`llamapy._native` — the cffi binding to libllama (loaded lazily).

``import llamapy`` stays light: each name above but the errors is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import errors
from .errors import LlamapyError

__version__ = "0.1.0"
__all__ = [
    "Completion",
    "DecodeConfig",
    "FinishReason",
    "LlamapyError",
    "ModelManager",
    "PrefixInput",
    "Server",
    "Session",
    "SessionConfig",
    "SuffixInput",
    "Usage",
    "__version__",
    "errors",
    "open_standalone",
]

if TYPE_CHECKING:
    from .engine.request import FinishReason
    from .runtime.client import Completion, Usage
    from .server import ModelManager, Server
    from .session import (
        DecodeConfig,
        PrefixInput,
        Session,
        SessionConfig,
        SuffixInput,
        open_standalone,
    )

#: Lazily exported name -> the module that defines it.
_LAZY = {
    "Server": "llamapy.server",
    "ModelManager": "llamapy.server",
    "Completion": "llamapy.runtime.client",
    "Usage": "llamapy.runtime.client",
    "FinishReason": "llamapy.engine.request",
    "Session": "llamapy.session",
    "SessionConfig": "llamapy.session",
    "DecodeConfig": "llamapy.session",
    "PrefixInput": "llamapy.session",
    "SuffixInput": "llamapy.session",
    "open_standalone": "llamapy.session",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'llamapy' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
