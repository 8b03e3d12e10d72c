"""The cffi binding to libllama: the only package of llamapy that touches cffi.

Loading is lazy: importing this package does nothing native; the library is opened on first
use of a wrapper. Wrappers own their pointers, are context managers, and raise
:class:`~llamapy.errors.ClosedError` after ``close()``. No scheduling or caching policy here.
"""

from ._loader import Native, c_text, check_layout, find_library, native
from .chat import apply_chat_template
from .context import (
    Batch,
    Context,
    ContextOptions,
    EmbeddingBatch,
    context_option_keys,
    tuning_option_keys,
)
from .model import LoraAdapter, Model, ModelOptions, load_option_keys
from .sampler import DEFAULT_SEED, SamplerChain

__all__ = [
    "DEFAULT_SEED",
    "Batch",
    "Context",
    "ContextOptions",
    "EmbeddingBatch",
    "LoraAdapter",
    "Model",
    "ModelOptions",
    "Native",
    "SamplerChain",
    "apply_chat_template",
    "check_layout",
    "context_option_keys",
    "find_library",
    "load_option_keys",
    "native",
    "tuning_option_keys",
]


def system_info() -> str:
    """llama.cpp's build/system info line (SIMD features, backends)."""
    nat = native()
    return c_text(nat.lib.llama_print_system_info())
