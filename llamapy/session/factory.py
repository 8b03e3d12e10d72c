"""Sessions from a model file: :func:`open_path` and the :class:`SessionFactory` it satisfies.

``open_path("model.gguf", SessionConfig(n_ctx=4096))`` loads the model, opens a standalone
session on it (its own context and tick thread, :func:`~llamapy.session.open_standalone`) and
hands the model to the session: closing the session frees the model too. Code that makes
sessions for model files can take any :class:`SessionFactory` (``open_path``, or a fake in
tests).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from llamapy._native import Model
from llamapy.session.config import SessionConfig
from llamapy.session.session import Session
from llamapy.session.standalone import open_standalone

__all__ = ["SessionFactory", "open_path"]


class SessionFactory(Protocol):
    """Makes a session for a model file under an explicit config."""

    def __call__(self, model_path: str | os.PathLike[str],
                 config: SessionConfig | None = None) -> Session: ...


def open_path(model_path: str | os.PathLike[str], config: SessionConfig | None = None,
              **model_options: Any) -> Session:
    """A standalone :class:`Session` on the GGUF at ``model_path``, loaded with
    ``model_options`` (:class:`~llamapy.options.ModelOptions` keywords: ``n_gpu_layers``,
    ``load_mode``, ...); the session owns the model and frees it on ``close()``. Raises
    :class:`~llamapy.errors.ModelLoadError` when the file does not load, and what
    :func:`~llamapy.session.open_standalone` raises for ``config``."""
    model = Model(model_path, **model_options)
    try:
        return open_standalone(model, config, owns_model=True)
    except BaseException:
        model.close()
        raise
