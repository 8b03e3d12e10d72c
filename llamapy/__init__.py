"""llamapy: serve llama.cpp models from Python.

- :class:`Server` — continuous batching over one model, sync and asyncio API.
- :class:`ModelManager` — many models, each its own ``Server``, loaded on demand under a budget.
- :mod:`llamapy.engine` — the backend-agnostic scheduling core (with a ``FakeBackend``).
- :mod:`llamapy._native` — the cffi binding to libllama (loaded lazily).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import errors
from .errors import LlamapyError

__version__ = "0.1.0"
__all__ = ["LlamapyError", "ModelManager", "Server", "__version__", "errors"]

if TYPE_CHECKING:
    from .server import ModelManager, Server


def __getattr__(name: str) -> Any:
    if name in ("Server", "ModelManager"):
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module 'llamapy' has no attribute {name!r}")
