"""``AffinityRouter``: Ray Serve's ``RequestRouter`` running llamapy's affinity policy.

Each handle to the model deployment (the ingress holds one) runs a router. For a request it reads
the :class:`~llamapy.ray.keys.RoutingKey` the ingress passed as the ``routing`` keyword, measures
each candidate's load and ranks the candidates with :func:`~llamapy.ray.affinity.choose`; Ray
then sends the request to the first replica of the best rank that accepts it (one below its
``max_ongoing_requests``). A replica's load is the larger of the requests this router placed on
it (chosen or running: current, and a concurrent burst sees itself) and the queued plus running
requests its last routing stats report (which also count other routers' requests, a stats
period old). Once a request is on a
replica, the table records its session and prefixes there; a dead or removed replica's entries
are dropped.

Unlike Ray's ``PrefixCacheAffinityRouter`` (a prefix tree in a separate actor, matched by
characters), the table is local to the router and matches hashed blocks, and the session key
comes first; unlike Ray's default router, requests are not routed in FIFO order: each routing
attempt serves the request it was started for (``FIFOMixin`` would hand the chosen replica to
the oldest pending request, whatever its key).
"""

from __future__ import annotations

import time
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

from .affinity import (
    MAX_ENTRIES,
    MAX_IMBALANCE,
    AffinityTable,
    LoadBook,
    ReplicaLoad,
    choose,
    engine_load,
)
from .keys import RoutingKey

#: The keyword argument of the model deployment's call that carries the routing key.
ROUTING_KWARG = "routing"


class AffinityRouter(RequestRouter):
    """Routes by session, then longest cached prefix (within ``cache_scope``), then load, with
    the imbalance bound ``max_imbalance``; ``max_entries`` bounds each LRU map.

    Configure it on the model deployment: ``RequestRouterConfig(request_router_class=
    AffinityRouter, request_router_kwargs={"max_imbalance": 4})`` (what
    :func:`llamapy.ray.build_app` does).
    """

    def initialize_state(self, max_imbalance: int = MAX_IMBALANCE,
                         max_entries: int = MAX_ENTRIES, **kwargs: Any) -> None:
        """Ray calls this once with the config's ``request_router_kwargs``."""
        self.table = AffinityTable(max_entries)
        self.max_imbalance = max_imbalance
        self.book = LoadBook()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        """The candidates ranked by :func:`~llamapy.ray.affinity.choose`; the first one counts
        as loaded by the request from now on."""
        by_id = {_rid(r.replica_id): r for r in candidate_replicas}
        now = time.monotonic()
        placed = self.book.counts(now)
        loads = [ReplicaLoad(rid, max(placed.get(rid, 0), engine_load(r.routing_stats or {})),
                             frozenset((r.routing_stats or {}).get("cache_scopes", ())))
                 for rid, r in by_id.items()]
        choice = choose(self.table, request_key(pending_request), loads,
                        max_imbalance=self.max_imbalance)
        if pending_request is not None and choice.ranks:
            self.book.chosen(pending_request.metadata.internal_request_id, choice.ranks[0][0],
                             now)
        return [[by_id[rid] for rid in rank] for rank in choice.ranks if rank]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: ReplicaResult) -> None:
        """The request is on ``replica_id``: count it there, record its key there."""
        rid = _rid(replica_id)
        self.book.routed(pending_request.metadata.internal_request_id, rid)
        key = request_key(pending_request)
        if not key.empty:
            self.table.record(key, rid)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request left its replica (done, failed or cancelled)."""
        self.book.completed(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Forget a dead replica at once (before the controller's update arrives)."""
        super().on_replica_actor_died(replica_id)
        self._drop(_rid(replica_id))

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """The controller's new replica set: forget the entries of replicas not in it."""
        super().update_replicas(replicas)
        alive = {_rid(r.replica_id) for r in replicas}
        for rid in self.table.replicas() - alive:
            self._drop(rid)

    def _drop(self, rid: str) -> None:
        self.table.forget(rid)
        self.book.drop(rid)


def request_key(pending_request: PendingRequest | None) -> RoutingKey:
    """The routing key a pending request carries (an empty key when it carries none)."""
    key = None if pending_request is None else pending_request.kwargs.get(ROUTING_KWARG)
    return key if isinstance(key, RoutingKey) else RoutingKey()


def _rid(replica_id: ReplicaID) -> str:
    return replica_id.to_full_id_str()
