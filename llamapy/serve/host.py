"""The model behind the app: served at once, or still being fetched/loaded in the background.

``ModelHost(server, **options)`` serves a running :class:`~llamapy.server.Server` (which may
itself still be loading its model); ``ModelHost(loader, **options)`` first runs ``loader()`` in
a thread (fetching the default model, say) while the HTTP server already answers ``/health``
with 503. ``options`` are those of :class:`~llamapy.openai_api.ServedModel` (``name``,
``chat_template``, ``request_timeout``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..errors import LlamapyError, LoadFailedError, NotReadyError
from ..openai_api import ServedModel
from ..server import Server

log = logging.getLogger("llamapy.serve")

Loader = Callable[[], Server]


class ModelHost:
    """Holds the :class:`ServedModel`; :meth:`get` raises the typed reason it is unavailable."""

    def __init__(self, target: Server | Loader, **served: Any) -> None:
        self._options = served
        self._served: ServedModel | None = None
        self._error: LlamapyError | None = None
        self._lock = threading.Lock()
        if isinstance(target, Server):
            self._served = ServedModel(target, **served)
        else:
            threading.Thread(target=self._load, args=(target,), name="llamapy-serve-load",
                             daemon=True).start()

    def _load(self, loader: Loader) -> None:
        try:
            server = loader()
        except Exception as exc:  # a foreign error while fetching: report, never die silently
            log.error("model load failed: %s", exc)
            error = exc if isinstance(exc, LoadFailedError) else LoadFailedError(exc)
            with self._lock:
                self._error = error
            return
        served = ServedModel(server, **self._options)
        with self._lock:
            self._served = served

    @property
    def served(self) -> ServedModel | None:
        """The served model once the loader returned (its server may still be loading)."""
        return self._served

    def get(self) -> ServedModel:
        """The served model if its server is ready; else raise why not (503)."""
        with self._lock:
            served, error = self._served, self._error
        if error is not None:
            raise error
        if served is None:
            raise NotReadyError("loading model")
        result = served.server.fetch_model()
        if isinstance(result, LlamapyError):
            raise result
        return served

    def status(self) -> str:
        """``loading``, ``ready`` or ``failed``."""
        try:
            self.get()
        except NotReadyError:
            return "loading"
        except LlamapyError:
            return "failed"
        return "ready"

    def close(self) -> None:
        """Close the server (when the app owns it)."""
        if self._served is not None:
            self._served.server.close()
