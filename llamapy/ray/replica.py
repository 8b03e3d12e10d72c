"""``LlamapyReplica``: the model deployment's class; each replica runs one llamapy ``Server``.

A replica loads its model when Ray starts it (Serve marks it running once the model is ready),
serves :class:`~llamapy.ray.forward.ForwardedRequest` s through the same
:func:`~llamapy.serve.create_app` app ``python -m llamapy.serve`` serves (streamed back message
by message, with an ``x-llamapy-replica`` header naming the replica), and reports its routing
stats (queue depth, active slots, KV use, cached prefixes: see
:func:`~llamapy.ray.affinity.routing_stats`) through Ray's ``record_routing_stats`` hook.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ray import serve
from starlette.types import Message

from ..server import Server
from .affinity import routing_stats
from .forward import REPLICA_HEADER, ForwardedRequest, run_asgi
from .keys import RoutingKey

#: Seconds a replica waits for its model to load before Serve sees it fail.
LOAD_TIMEOUT_S = 300.0

#: Seconds a stats snapshot may take (the tick thread answers between ticks).
STATS_TIMEOUT_S = 5.0


class LlamapyReplica:
    """One model replica: ``Server(model_path, **start_options)`` behind
    ``create_app(server, **app_options)``."""

    def __init__(self, model_path: str, start_options: Mapping[str, Any],
                 app_options: Mapping[str, Any]) -> None:
        from ..serve.app import create_app

        self.replica_id = _replica_name()
        self._server = Server(model_path, **start_options)
        try:
            self._server.wait_ready(LOAD_TIMEOUT_S)
            self._app = create_app(self._server, **app_options)
        except BaseException:
            self._server.close()
            raise
        self._header = ((REPLICA_HEADER.encode(), self.replica_id.encode()),)

    async def forward(self, request: ForwardedRequest, routing: RoutingKey | None = None
                      ) -> AsyncIterator[Message]:
        """Serve one request; yield its ASGI response messages (``routing``, the router's
        key, is not needed here)."""
        async for message in run_asgi(self._app, request, self._header):
            yield message

    async def record_routing_stats(self) -> dict[str, Any]:
        """Ray's routing-stats hook: this replica's load and cache summary."""
        stats = await asyncio.to_thread(self._server.stats, STATS_TIMEOUT_S)
        return {**routing_stats(stats), "replica": self.replica_id}

    def check_health(self) -> None:
        """Ray's health check: raise when the server stopped (Serve then replaces us)."""
        self._server.fetch_model()  # raises the typed reason the model is unavailable

    def __del__(self) -> None:
        """Serve's shutdown hook: stop the server (in-flight requests end as closed)."""
        server = getattr(self, "_server", None)
        if server is not None:
            server.close()


def _replica_name() -> str:
    """This replica's unique id (its process id outside Serve, in tests of the class)."""
    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # not in a replica: no context
        import os

        return f"pid-{os.getpid()}"
