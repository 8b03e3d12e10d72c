"""Load a model's weights on a thread ahead of its first use.

``python -m llamapy.serve`` calls :func:`prefetch` right after parsing its flags, before it
imports the engine and the HTTP stack: ``llama_model_load_from_file`` runs in C (without the
GIL) while Python imports, instead of after. The server's tick thread then takes the model
(:func:`take`) rather than loading the file again. A prefetch that nobody takes keeps its
model until the process exits; one that failed re-raises its error in :func:`take`.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from pathlib import Path

from .model import Model, ModelOptions

__all__ = ["prefetch", "take"]

_Key = tuple[Path, ModelOptions]
_pending: dict[_Key, Future[Model]] = {}
_lock = threading.Lock()


def _key(path: str | os.PathLike[str], options: ModelOptions) -> _Key:
    return Path(path).resolve(), options


def prefetch(path: str | os.PathLike[str], options: ModelOptions) -> None:
    """Start loading ``path`` with ``options`` on a daemon thread (once per file and options)."""
    key = _key(path, options)
    future: Future[Model] = Future()
    with _lock:
        if key in _pending:
            return
        _pending[key] = future

    def load() -> None:
        try:
            future.set_result(Model(path, options))
        except BaseException as exc:  # delivered to whoever takes it
            future.set_exception(exc)

    threading.Thread(target=load, name="llamapy-prefetch", daemon=True).start()


def take(path: str | os.PathLike[str], options: ModelOptions) -> Model | None:
    """The prefetched model for ``path`` and ``options`` (waiting for its load to end), or
    None when none was prefetched. Each prefetch is taken once; a failed load raises here."""
    with _lock:
        future = _pending.pop(_key(path, options), None)
    return None if future is None else future.result()
