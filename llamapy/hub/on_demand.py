"""Pull on demand: a request that names a Hub model not served yet (``hf.co/ORG/REPO:QUANT``)
pulls it into the store and serves it — only behind ``--pull-on-demand``, off by default.

:class:`OnDemandPuller` is called by :class:`~llamapy.serve.multi.ModelRouter` on a worker
thread (never the event loop) with the name a request sent, after the manager did not know it.
A name that is not a Hub name stays an :class:`~llamapy.errors.UnknownModelError` (404); one
pull runs at a time, and a request that waited for another's pull of the same model finds it
served. A failed pull (no such repository or tag, a checksum mismatch, the Hub unreachable)
answers that request with its typed error and adds nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidOptionError, UnknownModelError
from ..options.hub import parse_model_ref
from ..server import ModelManager, ModelSpec
from .fetch import HubAccess
from .store import ModelStore

__all__ = ["OnDemandPuller"]


class OnDemandPuller:
    """Pulls a requested Hub model into ``store`` and adds it to ``manager`` with the
    command line's start ``options``."""

    def __init__(self, manager: ModelManager, store: ModelStore, access: HubAccess,
                 options: Mapping[str, Any]) -> None:
        self.manager = manager
        self.store = store
        self.access = access
        self.options = dict(options)
        self._lock = threading.Lock()

    def __call__(self, requested: str) -> str:
        """The served name of ``requested``, pulled and added first if need be."""
        try:
            ref = parse_model_ref(requested, option="model")
        except InvalidOptionError:
            raise UnknownModelError(requested, self.manager.names) from None
        with self._lock:
            try:
                return self.manager.resolve(ref.name)  # pulled by a request we waited for
            except UnknownModelError:
                pass
            entry = self.store.pull(ref, self.access)
            served = set(self.manager.names)
            self.manager.add(ModelSpec(
                name=entry.name, path=entry.path, options=self.options,
                aliases=tuple(a for a in entry.aliases if a not in served)))
            return entry.name
