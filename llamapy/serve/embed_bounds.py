"""The engine's request bounds, applied to embeddings requests.

An embeddings request runs on an :class:`~llamapy.embeddings.Embedder` (its own context and
worker thread, beside the engine), so the engine's admission never sees it. :class:`InFlight`
holds it to the same two bounds of the model's start options, counted per model, before
anything of it runs:

- **the queue** (``max_queue`` > 0): at most ``max_queue`` requests wait besides the one
  running, ``max_queue + 1`` in flight; one more is a
  :class:`~llamapy.errors.QueueFullError` (429). A shared embedder bounds its own queue the
  same way; this bound holds also where each request gets an embedder of its own (several
  models), which would otherwise run any number at once;
- **the tenant** (``tenant_max_requests`` > 0): at most that many of one tenant's requests in
  flight; one more is a :class:`~llamapy.errors.TenantBusyError` (429 for that tenant alone,
  others still admitted), so one tenant cannot fill the embedder's queue for all.

A tenant's embeddings requests count apart from its generation requests (they wait for another
resource than the engine's slots), each kind within the same bound.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from ..errors import QueueFullError, TenantBusyError
from ..options.engine import EngineConfig

__all__ = ["InFlight"]


class InFlight:
    """Embeddings requests in flight, by model and by (model, tenant); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: Counter[str] = Counter()
        self._tenants: Counter[tuple[str, str | None]] = Counter()

    @contextlib.contextmanager
    def hold(self, model: str, tenant: str | None, bounds: EngineConfig) -> Iterator[None]:
        """Count one request of ``tenant`` on ``model`` while the block runs; raise, counting
        nothing, when ``bounds`` (the model's engine options) refuse it (see the module)."""
        key = (model, tenant)
        with self._lock:
            if 0 < bounds.tenant_max_requests <= self._tenants[key]:
                raise TenantBusyError(tenant, bounds.tenant_max_requests)
            if 0 < bounds.max_queue < self._models[model]:  # (one runs, max_queue wait)
                raise QueueFullError(bounds.max_queue)
            self._models[model] += 1
            self._tenants[key] += 1
        try:
            yield
        finally:
            with self._lock:
                _release(self._models, model)
                _release(self._tenants, key)

    def counts(self) -> tuple[dict[str, int], dict[tuple[str, str | None], int]]:
        """Requests in flight by model and by (model, tenant) (none: absent)."""
        with self._lock:
            return dict(self._models), dict(self._tenants)


def _release(counts: Counter[Any], key: Any) -> None:
    """One less of ``key``; none left: gone (the maps hold what is in flight only)."""
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]
