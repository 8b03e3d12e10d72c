"""``--sleep-idle-seconds N``: unload the model after N quiet seconds, reload it on demand.

The policy (llama-server's). A request on a route that runs on the model (a route declared
:data:`~llamapy.serve.model_use.ON_MODEL`; ``/props`` is only read) is *activity*:
:class:`WakeOnRequest`
holds a lease on the model (:meth:`ModelHost.enter <llamapy.serve.host.ModelHost.enter>`) for
its whole response (streams included), waking the model first, so the request waits for the
reload. Only a request with a valid API key wakes it: the key is checked from the headers first
(:func:`~llamapy.serve.multi.check_caller`), and a request without one is answered its 401 (in
its route's shape) while the model sleeps on. N is the ``keep_alive`` of the host's one-spec
model manager: once no lease has been held for N seconds the manager unloads the model, after
the host's hooks took the snapshots of ``/props`` (then ``is_sleeping: true``), ``/v1/models``
and the engine's stats; the server is then closed (weights and KV freed). While asleep
``/props`` and ``/v1/models`` answer from the snapshots and ``/metrics`` renders with the
engine's counters as they were (the HTTP-side metrics stay live: a throughput window with
nothing in it reads 0), none of them waking it; ``/health`` answers ``ok``. A wake-up does not
start the next quiet spell until its request ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import LlamapyError
from ..openai_api import ServedModel
from ..openai_api import llama_compat as compat
from ..server import ModelLease
from .model_use import RoutePolicy
from .multi import check_caller, path_error

__all__ = ["WakeOnRequest", "sleep_snapshot"]


def sleep_snapshot(served: ServedModel, models: dict[str, Any]) -> dict[str, Any]:
    """What the read-only routes read while asleep: ``props`` (``is_sleeping: true``),
    ``models`` (``/v1/models``) and ``stats`` (the engine's, for ``/metrics``)."""
    return {"props": {**compat.props(served), "is_sleeping": True}, "models": models,
            "stats": served.server.stats()}


class WakeOnRequest:
    """ASGI middleware: a request on a route that wakes the model (``policy`` says which)
    holds a lease on the model (``enter``: waking it first; None while it first loads or after
    it failed, the route then answering why) until its response has been sent, once
    ``check_key`` (the app's) took its key."""

    def __init__(self, app: ASGIApp, enter: Callable[[], ModelLease | None],
                 check_key: Callable[[Request], Any], policy: RoutePolicy,
                 try_enter: Callable[[], ModelLease | None] | None = None) -> None:
        self.app = app
        self.enter = enter
        self.try_enter = try_enter
        self.check_key = check_key
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        use = self.policy.use(path)
        if scope["type"] != "http" or not use.wakes:
            await self.app(scope, receive, send)
            return
        try:
            check_caller(self.check_key, scope, use)
        except LlamapyError as exc:  # no key: answered without waking the model
            await path_error(path, exc)(scope, receive, send)
            return
        lease = None if self.try_enter is None else self.try_enter()  # loaded: no thread hop
        if lease is None:
            lease = await run_in_threadpool(self.enter)
        try:
            await self.app(scope, receive, send)
        finally:
            if lease is not None:
                lease.release()
