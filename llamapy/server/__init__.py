"""The threaded continuous-batching server (sync and asyncio API).

It also hands out the loaded :class:`Model` (tokenizer, vocabulary, chat template): the layers
above name that type from here, never from the binding.
"""

from .._native import Model
from .._system import physical_cores
from ..adapters import AdapterSet, resolve_adapters
from ..runtime import Completion, ModelInfo, Usage
from .calls import with_checkpoint_hints
from .intent import DEFAULT_TIMEOUT, GenerationIntent
from .manager import ModelManager
from .model_spec import ModelLease, ModelSpec, ModelState, ModelStatus, parse_keep_alive
from .options import call_option_keys, server_request_option_keys, start_option_keys
from .server import Server

__all__ = [
    "DEFAULT_TIMEOUT",
    "AdapterSet",
    "Completion",
    "GenerationIntent",
    "Model",
    "ModelInfo",
    "ModelLease",
    "ModelManager",
    "ModelSpec",
    "ModelState",
    "ModelStatus",
    "Server",
    "Usage",
    "call_option_keys",
    "parse_keep_alive",
    "physical_cores",
    "resolve_adapters",
    "server_request_option_keys",
    "start_option_keys",
    "with_checkpoint_hints",
]
