"""Embeddings by model file: :class:`EmbedFunc`, :func:`embed_path` and the function behind it.

``embed_path("model.gguf", "some text")`` returns the text's embedding (a float32 vector,
mean-pooled and L2-normalised) through the registered :class:`EmbedFunc`. The default,
:func:`native_embed`, loads each model file once (its weights and a private embeddings
context, kept until :func:`close_embedders` or interpreter exit) and is safe from any thread.
:func:`register_embed_func` swaps it: for an embedding service, a cache in front of the
native one, or a fake in tests. A session's own :meth:`~llamapy.session.Session.embed` is
separate: it embeds with the session's model and adapters.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import TYPE_CHECKING, Protocol

from llamapy._native import Model
from llamapy.embeddings import Embedder
from llamapy.errors import UnsupportedFeatureError
from llamapy.session.config import SessionConfig

if TYPE_CHECKING:
    import numpy as np

__all__ = ["EmbedFunc", "close_embedders", "embed_path", "native_embed", "register_embed_func"]

#: The embeddings context's size when the config does not set ``n_ctx``.
DEFAULT_EMBED_CTX = 2048

_lock = threading.Lock()
_registered: EmbedFunc | None = None
_embedders: dict[tuple[str, int], Embedder] = {}


class EmbedFunc(Protocol):
    """Computes one text's embedding with the model at ``model_path`` under ``config``."""

    def __call__(self, model_path: str | os.PathLike[str], text: str,
                 config: SessionConfig | None = None) -> np.ndarray: ...


def register_embed_func(fn: EmbedFunc | None) -> EmbedFunc:
    """Make ``fn`` the function :func:`embed_path` calls (None: :func:`native_embed` again);
    returns the one it replaces, so a caller can put it back."""
    global _registered
    if fn is not None and not callable(fn):
        raise TypeError(f"an embed function must be callable, got {type(fn).__name__}")
    with _lock:
        previous, _registered = _registered or native_embed, fn
    return previous


def embed_path(model_path: str | os.PathLike[str], text: str,
               config: SessionConfig | None = None) -> np.ndarray:
    """``text``'s embedding with the model at ``model_path``, by the registered
    :class:`EmbedFunc` (default :func:`native_embed`)."""
    if not isinstance(text, str):
        raise TypeError(f"embed_path embeds one string, got {type(text).__name__}")
    if config is not None and not isinstance(config, SessionConfig):
        raise TypeError(f"config must be a SessionConfig, got {type(config).__name__}")
    fn = _registered or native_embed
    return fn(model_path, text, config)


def native_embed(model_path: str | os.PathLike[str], text: str,
                 config: SessionConfig | None = None) -> np.ndarray:
    """The embedding by llama.cpp: the model file is loaded on first use and kept (one
    embedder per file and ``config.n_ctx``, default 2048 tokens). Raises
    :class:`~llamapy.errors.ModelLoadError` for a file that does not load,
    :class:`~llamapy.errors.ContextOverflowError` for a text longer than ``n_ctx`` tokens and
    :class:`~llamapy.errors.UnsupportedFeatureError` for a config with adapters (embed with
    a session for those)."""
    if config is not None and config.adapters:
        raise UnsupportedFeatureError("adapters", "embed_path embeds with the base model; "
                                      "use Session.embed for adapters")
    n_ctx = DEFAULT_EMBED_CTX if config is None or config.n_ctx is None else config.n_ctx
    vector: np.ndarray = _embedder(model_path, n_ctx).embed(text)
    return vector


def close_embedders() -> int:
    """Free every model :func:`native_embed` loaded (the next call loads again); returns how
    many were freed."""
    with _lock:
        embedders = list(_embedders.values())
        _embedders.clear()
    for embedder in embedders:
        embedder.close()
        embedder.model.close()
    return len(embedders)


def _embedder(model_path: str | os.PathLike[str], n_ctx: int) -> Embedder:
    key = (os.path.realpath(os.fspath(model_path)), n_ctx)
    with _lock:
        embedder = _embedders.get(key)
        if embedder is None:
            model = Model(key[0])
            try:
                embedder = Embedder(model, n_ctx=n_ctx)
            except BaseException:
                model.close()
                raise
            _embedders[key] = embedder
    return embedder


atexit.register(close_embedders)
