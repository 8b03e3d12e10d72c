"""The threaded continuous-batching server (sync and asyncio API)."""

from .._system import physical_cores
from ..adapters import AdapterSet, resolve_adapters
from ..runtime import Completion, Usage
from .options import call_option_keys, request_option_keys, start_option_keys
from .server import Server

__all__ = [
    "AdapterSet",
    "Completion",
    "Server",
    "Usage",
    "call_option_keys",
    "physical_cores",
    "request_option_keys",
    "resolve_adapters",
    "start_option_keys",
]
