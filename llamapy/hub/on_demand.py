"""Pull on demand: a request that names a Hub model not served yet (``hf.co/ORG/REPO:QUANT``)
pulls it into the store and serves it — only behind ``--pull-on-demand``, off by default.

:class:`OnDemandPuller` is called by :class:`~llamapy.serve.multi.ModelRouter` on a worker
thread (never the event loop) with the name a request sent, after the manager did not know it
and after the router checked that the request's key may pull (an admin's, when keys carry
tenants). The policy, in order, each step before any byte is downloaded:

1. Only a name that spells the Hub out pulls (``hf.co/ORG/REPO[:QUANT]``, as Ollama's do:
   :func:`~llamapy.options.hub.parse_pull_name`); any other name, a bare ``ORG/REPO``
   included, stays an :class:`~llamapy.errors.UnknownModelError` (404).
2. With ``allow`` patterns (``--pull-allow``) a repository matching none is a
   :class:`~llamapy.errors.PullRefusedError` (403), before the Hub is asked anything.
3. With ``max_bytes`` (``--pull-max-bytes``) the chosen files' sizes in the Hub's listing
   must fit it, else a :class:`~llamapy.errors.PullRefusedError` (403) before any file is
   requested (:func:`~llamapy.hub.fetch.fetch_model`).

One pull runs at a time, and a request that waited for another's pull of the same model finds
it served. A failed pull (no such repository or tag, a checksum mismatch, the Hub unreachable)
answers that request with its typed error and adds nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidOptionError, PullRefusedError, UnknownModelError
from ..options.hub import DEFAULT_PULL_MAX_BYTES, ModelRef, parse_pull_name, pull_allowed
from ..server import ModelManager, ModelSpec
from .fetch import HubAccess
from .store import ModelStore

__all__ = ["OnDemandPuller"]


class OnDemandPuller:
    """Pulls a requested Hub model into ``store`` and adds it to ``manager`` with the
    command line's start ``options``, within ``allow`` (ORG/REPO globs; empty: any) and
    ``max_bytes`` (0: no cap)."""

    def __init__(self, manager: ModelManager, store: ModelStore, access: HubAccess,
                 options: Mapping[str, Any], *, allow: tuple[str, ...] = (),
                 max_bytes: int = DEFAULT_PULL_MAX_BYTES) -> None:
        self.manager = manager
        self.store = store
        self.access = access
        self.options = dict(options)
        self.allow = tuple(allow)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def __call__(self, requested: str) -> str:
        """The served name of ``requested``, pulled and added first if need be."""
        ref = self._checked(requested)
        with self._lock:
            try:
                return self.manager.resolve(ref.name)  # pulled by a request we waited for
            except UnknownModelError:
                pass
            entry = self.store.pull(ref, self.access, max_bytes=self.max_bytes)
            served = set(self.manager.names)
            self.manager.add(ModelSpec(
                name=entry.name, path=entry.path, options=self.options,
                aliases=tuple(a for a in entry.aliases if a not in served)))
            return entry.name

    def _checked(self, requested: str) -> ModelRef:
        """``requested`` as a pull name within ``allow`` (steps 1 and 2 of the policy)."""
        try:
            ref = parse_pull_name(requested)
        except InvalidOptionError:
            raise UnknownModelError(requested, self.manager.names) from None
        if not pull_allowed(ref.repo, self.allow):
            raise PullRefusedError(f"{ref.name}: this server pulls only repositories matching "
                                   f"{', '.join(self.allow)} (--pull-allow)", repo=ref.repo)
        return ref
