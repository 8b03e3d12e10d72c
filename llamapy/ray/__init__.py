"""Serve a model on several replicas with Ray Serve, routed to the replica that holds its KV.

``pip install 'llamapy[ray]'``, then ``serve run llamapy.ray:app model=PATH replicas=2`` (any
``python -m llamapy.serve`` flag as ``key=value``; see :func:`~llamapy.ray.builder.app`), or from
Python ``serve.run(llamapy.ray.build_app(PATH, n_ctx=4096))``. The application is:

- an ingress deployment (:class:`~llamapy.ray.ingress.LlamapyIngress`) that reads each HTTP
  request, computes its routing key (:mod:`llamapy.ray.keys`: session, ``cache_scope``, prompt
  prefix hashes, all within the tenant of the caller's API key: :mod:`llamapy.ray.tenancy`)
  and relays it to
- the model deployment (:class:`~llamapy.ray.replica.LlamapyReplica`): each replica runs one
  :class:`~llamapy.Server` behind the same app as ``python -m llamapy.serve`` (every OpenAI,
  Anthropic, Responses and llama-server route), and reports its load and cache summary through
  Ray's routing-stats hook; requests reach it through
- :class:`~llamapy.ray.router.AffinityRouter`, a Ray Serve ``RequestRouter``: session first,
  then the longest cached prefix within the ``cache_scope``, then load, with a bound on the
  imbalance (:mod:`llamapy.ray.affinity`).

A replica that dies fails its in-flight requests fast with a 503
(:class:`~llamapy.errors.ReplicaUnavailableError`); Serve replaces it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .builder import app, build_app
    from .router import AffinityRouter

__all__ = ["AffinityRouter", "app", "build_app"]


def __getattr__(name: str) -> Any:
    # Lazy: the policy modules (keys, affinity, forward) import without Ray.
    if name in ("app", "build_app"):
        from . import builder as module

        return getattr(module, name)
    if name == "AffinityRouter":
        from .router import AffinityRouter

        return AffinityRouter
    raise AttributeError(f"module 'llamapy.ray' has no attribute {name!r}")
