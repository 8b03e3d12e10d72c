"""The affinity policy: which replica should serve a request, given its key and the loads.

A request goes to the replica that holds its KV, unless that replica is overloaded. The holder
is, in order: the replica that last served the request's ``session``; the replica that last
served the longest prefix of its text (the longest run of its prefix hashes in the table);
the least-loaded replica whose stats list the request's scope (its tenant and
``cache_scope``). A holder is used only while its load exceeds the least-loaded replica's by at
most ``max_imbalance`` (so one hot session or shared prompt cannot pile its traffic on one
replica); otherwise, and when nothing holds the request, the least-loaded replicas come
first. A new session (a session key the table does not know) follows a prefix or scope holder
only while that holder is among the least loaded: the session will stay where it starts, so
its start balances the load, and a prompt shared by every session (a tenant's system prompt)
is cheap to compute once per replica. The choice is a list of ranks, most preferred first
(Ray Serve's ``choose_replicas`` contract): the chosen replica alone (the holder, or one of the
least loaded at random), then the rest by load, the fallback if it refuses the request.

Loads count what the router itself placed (:class:`LoadBook`): a request counts on a replica
from the moment it is chosen, not only once the replica accepted it, so a burst of requests
routed concurrently sees each other and spreads.

The table remembers, in two bounded LRU maps, the replica each session and each prefix hash was
last routed to; :meth:`AffinityTable.record` is called once a request is on its replica (its
KV is being built there), :meth:`AffinityTable.forget` when a replica dies. Nothing here
imports Ray (:mod:`llamapy.ray.router` adapts it), so the policy is tested on its own.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..options.deployment import DEPLOYMENT_DEFAULTS
from .keys import RoutingKey, scope_id

#: Default bound on the entries of each map (sessions, prefix hashes).
MAX_ENTRIES = DEPLOYMENT_DEFAULTS.max_entries

#: Default imbalance bound (requests in flight or queued).
MAX_IMBALANCE = DEPLOYMENT_DEFAULTS.max_imbalance


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """A candidate replica: its id, its load (requests running or queued) and the cache
    scopes its stats say it holds."""

    replica: str
    load: int
    scopes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Choice:
    """The ranked replicas for a request and why the first rank was chosen (``session``,
    ``prefix``, ``scope``, ``load``; ``overloaded`` when a holder was skipped)."""

    ranks: list[list[str]]
    reason: str


@dataclass(eq=False)
class AffinityTable:
    """Bounded LRU maps session -> replica and prefix hash -> replica."""

    max_entries: int = MAX_ENTRIES
    _sessions: OrderedDict[str, str] = field(default_factory=OrderedDict, init=False)
    _prefixes: OrderedDict[str, str] = field(default_factory=OrderedDict, init=False)

    def holder(self, key: RoutingKey, alive: Collection[str]) -> tuple[str | None, str]:
        """The live replica holding ``key`` and how it was found (``session`` or ``prefix``),
        or ``(None, "")``; a hit counts as a use for the LRU order."""
        if key.session is not None:
            replica = _touch(self._sessions, key.session)
            if replica in alive:
                return replica, "session"
        for digest in reversed(key.prefix):
            replica = _touch(self._prefixes, digest)
            if replica in alive:
                return replica, "prefix"
        return None, ""

    def record(self, key: RoutingKey, replica: str) -> None:
        """Remember that ``replica`` now holds ``key``'s session and prefixes."""
        if key.session is not None:
            _put(self._sessions, key.session, replica, self.max_entries)
        for digest in key.prefix:
            _put(self._prefixes, digest, replica, self.max_entries)

    def forget(self, replica: str) -> None:
        """Drop every entry of a replica that is gone."""
        for table in (self._sessions, self._prefixes):
            for name in [name for name, owner in table.items() if owner == replica]:
                del table[name]

    def replicas(self) -> set[str]:
        """The replicas some entry points to."""
        return {*self._sessions.values(), *self._prefixes.values()}

    def __len__(self) -> int:
        return len(self._sessions) + len(self._prefixes)

    def check_integrity(self) -> None:
        """Both maps within ``max_entries``; every owner a non-empty id."""
        for table in (self._sessions, self._prefixes):
            assert len(table) <= self.max_entries, (len(table), self.max_entries)
            assert all(isinstance(owner, str) and owner for owner in table.values())


@dataclass(eq=False)
class LoadBook:
    """The requests a router placed on each replica: chosen (counted for ``ttl_s`` at most, in
    case the request is never sent) or running (until completed)."""

    ttl_s: float = 30.0
    _chosen: dict[str, tuple[str, float]] = field(default_factory=dict, init=False)
    _running: dict[str, str] = field(default_factory=dict, init=False)

    def chosen(self, request: str, replica: str, now: float) -> None:
        """``request`` is about to be sent to ``replica`` (a later choice replaces it)."""
        if request not in self._running:
            self._chosen[request] = (replica, now)

    def routed(self, request: str, replica: str) -> None:
        """``request`` runs on ``replica``."""
        self._chosen.pop(request, None)
        self._running[request] = replica

    def completed(self, request: str) -> None:
        """``request`` left its replica (done, failed or cancelled)."""
        self._chosen.pop(request, None)
        self._running.pop(request, None)

    def drop(self, replica: str) -> None:
        """Forget a replica that is gone."""
        self._chosen = {k: v for k, v in self._chosen.items() if v[0] != replica}
        self._running = {k: v for k, v in self._running.items() if v != replica}

    def counts(self, now: float) -> dict[str, int]:
        """Requests per replica, chosen or running (expired choices dropped)."""
        self._chosen = {k: v for k, v in self._chosen.items() if now - v[1] <= self.ttl_s}
        out: dict[str, int] = {}
        for replica in [*self._running.values(), *(v[0] for v in self._chosen.values())]:
            out[replica] = out.get(replica, 0) + 1
        return out


def _touch(table: OrderedDict[str, str], name: str) -> str | None:
    replica = table.get(name)
    if replica is not None:
        table.move_to_end(name)
    return replica


def _put(table: OrderedDict[str, str], name: str, replica: str, bound: int) -> None:
    table[name] = replica
    table.move_to_end(name)
    while len(table) > bound:
        table.popitem(last=False)


def choose(table: AffinityTable, key: RoutingKey, loads: Sequence[ReplicaLoad], *,
           max_imbalance: int = MAX_IMBALANCE, rng: random.Random | None = None) -> Choice:
    """The ranked replicas for ``key`` among ``loads`` (see the module docstring)."""
    if not loads:
        return Choice([], "load")
    by_id = {item.replica: item for item in loads}
    least = min(item.load for item in loads)
    replica, reason = table.holder(key, by_id)
    if replica is None and key.scope is not None:
        replica, reason = _scope_holder(key.scope, loads)
    bound = max_imbalance if reason == "session" or key.session is None else 0
    if replica is not None and by_id[replica].load - least <= bound:
        return Choice([[replica], [r for r in by_id if r != replica]], reason)
    shuffled = list(by_id)
    (rng or random).shuffle(shuffled)
    first = next(r for r in shuffled if by_id[r].load == least)
    rest = sorted((r for r in shuffled if r != first), key=lambda r: by_id[r].load)
    return Choice([[first], rest] if rest else [[first]],
                  "load" if replica is None else "overloaded")


def _scope_holder(scope: str, loads: Sequence[ReplicaLoad]) -> tuple[str | None, str]:
    """The least-loaded replica that holds KV of ``scope``."""
    holders = [item for item in loads if scope in item.scopes]
    if not holders:
        return None, ""
    return min(holders, key=lambda item: item.load).replica, "scope"


def routing_stats(stats: Mapping[str, Any]) -> dict[str, Any]:
    """What a replica reports to the routers from its server's :meth:`~llamapy.Server.stats`:
    queue depth, active slots, KV use and a summary of its cached prefixes (slots holding a
    prefix, their tokens, the scopes of their KV by :func:`~llamapy.ray.keys.scope_id`: no
    tenant, scope or session is named)."""
    slots = [slot for slot in stats.get("slots", []) if isinstance(slot, Mapping)]
    cached = [slot for slot in slots if int(slot.get("cached_tokens") or 0) > 0]
    cached_tokens = sum(int(slot["cached_tokens"]) for slot in cached)
    n_ctx = int(stats.get("n_ctx") or 0)
    return {
        "queue_depth": int(stats.get("queue_depth") or 0),
        "slots_active": int(stats.get("slots_active") or 0),
        "n_parallel": int(stats.get("n_parallel") or 0),
        "kv_used": cached_tokens / n_ctx if n_ctx else 0.0,
        "cached_slots": len(cached),
        "cached_tokens": cached_tokens,
        "cache_scopes": sorted(_scope_ids(cached)),
        "ram_cache_entries": int(stats.get("ram_cache_entries") or 0),
    }


def _scope_ids(slots: list[Mapping[str, Any]]) -> set[str]:
    """The :func:`~llamapy.ray.keys.scope_id` of each slot's KV (the shared pool left out)."""
    ids = (scope_id(_name(slot.get("tenant")), _name(slot.get("cache_scope"))) for slot in slots)
    return {item for item in ids if item is not None}


def _name(value: Any) -> str | None:
    return str(value) if value else None


def engine_load(stats: Mapping[str, Any]) -> int:
    """A replica's load from its routing stats: requests queued plus running."""
    return int(stats.get("queue_depth") or 0) + int(stats.get("slots_active") or 0)
