"""What each API key sees of the server when keys carry tenants (:mod:`llamapy.serve.tenants`).

An admin (every key when no key names a tenant, or no key at all) sees everything, each slot's
``cache_scope`` shown as ``tenant/sub`` (:attr:`~llamapy.engine.request.CacheKey.display_scope`;
the plain scope for the default tenant, so a server without tenants shows what it always did).

A tenant key (the default tenant's too, once tenancy is on):

- ``GET /slots`` and the events feed (``/v1/llamapy/events``, and so the dashboard) list every
  slot, in order, but only the slots whose KV is the key's tenant's in full (``cache_scope`` is
  then the tenant's own sub-scope). Another tenant's slot is a bare entry: :data:`BARE_FIELDS`
  (its id, ``n_ctx``, state and whether it is busy) and ``"other_tenant": true``, never its
  scope, session, request or lease ids, prompt or token counts. The feed's recent instability
  events (they carry request ids) are left out, and so are the server's totals, in every
  ``--cache-report`` mode: two readings of a total around another tenant's request would tell
  its prompt and output sizes. In their place the feed counts the key's own tenant's requests
  alone (``tokens``, ``requests``, ``reused``, ``ttft``, ``queue_depth``: see
  :mod:`llamapy.engine.tenant_counts`; the frame says ``"view": "tenant"``); the caches and
  the instability and KV pressure events (:data:`SERVER_SECTIONS`) are the whole server's and
  are not shown. An admin's feed has the totals and each tenant's counters (``tenants``).
- ``POST /slots/{id}?action=...``: see :mod:`llamapy.serve.routes.slot_files` (its own slots
  only, files in its own folder, 403 otherwise).
- ``GET /props``: ``model_path`` is the model file's name alone (:func:`props_view`), and
  ``/v1/models`` names a model that failed to load by its file name in its ``error``
  (:func:`models_view`): no key but an admin's sees where the server keeps its files.
  (``/api/show``'s Modelfile names the file alone for every key, and ``/slots`` shows none.)
- With ``--cache-report coarse|off`` a key that is not an admin's sees its own slots bare too,
  and the feed without its own token counters (:data:`COUNTED_TOKENS`): slot token counts, and
  counters read before and after one request, would tell that request's reuse exactly.
- ``GET /metrics`` is a 403: the metrics are the whole server's (Prometheus scrapes with an
  admin key); ``/metrics?model=`` is refused before the model is loaded. With several models,
  ``/models/load`` and ``/models/unload`` are admins' too: they change what every tenant is
  served; so is Ollama's ``keep_alive`` (a tenant key's is ignored, its request served: see
  :mod:`llamapy.serve.routes.ollama`). A sleeping model is woken by a request with a valid key
  only (:mod:`llamapy.serve.sleep`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from ...engine.request import CacheKey
from ..tenants import Principal

__all__ = ["BARE_FIELDS", "COUNTED_TOKENS", "SERVER_SECTIONS", "feed_view", "hide_paths",
           "models_view", "props_view", "slot_view"]

#: Feed sections that count tokens (reused by source, prompt, cached): what ``--cache-report
#: coarse|off`` hides from keys that are not an admin's, as a before-and-after difference
#: around one request would tell its exact reuse.
COUNTED_TOKENS = ("reused", "tokens", "ram_cache", "disk_cache")

#: Feed sections of the whole server's that a tenant key never sees (its own tenant's counters
#: replace ``tokens``, ``requests``, ``reused``, ``ttft`` and ``queue_depth``).
SERVER_SECTIONS = ("ram_cache", "disk_cache", "events")
#: A snapshot's counts of one tenant's requests (its ``by_tenant`` entries' keys).
TENANT_KEYS = ("tokens", "requests", "reused", "ttft", "queue_depth")

#: What a tenant key sees of another tenant's slot.
BARE_FIELDS = ("id", "n_ctx", "speculative", "state", "is_processing")


def slot_view(entries: Iterable[Mapping[str, Any]], principal: Principal,
              exact: bool = True) -> list[dict[str, Any]]:
    """``/slots`` entries (:func:`~llamapy.openai_api.llama_compat.slot_entries`) as
    ``principal`` sees them (see the module); not ``exact`` (``--cache-report coarse|off``),
    a key that is not an admin's sees its own slots bare too."""
    out = []
    for entry in entries:
        tenant = entry.get("tenant")
        if not principal.sees(tenant) or not (exact or principal.admin):
            out.append({**{k: entry[k] for k in BARE_FIELDS if k in entry},
                        "other_tenant": not principal.owns(tenant)})
        elif principal.admin:
            scope = CacheKey(entry.get("cache_scope"), tenant=tenant).display_scope
            out.append({**entry, "cache_scope": scope})
        else:
            out.append(dict(entry))
    return out


def feed_view(frame: Mapping[str, Any], principal: Principal, exact: bool = True
              ) -> dict[str, Any]:
    """An events-feed frame (:func:`~llamapy.serve.pages.live_view.frame`) as ``principal`` sees
    it (see the module): its slots through :func:`slot_view`; an admin's with each tenant's
    counters (``tenants``); any other key's without the recent instability events and the
    server's totals, its own tenant's counts in their place (zeros before its first request);
    not ``exact``, without its token counters either."""
    by_tenant: Mapping[Any, Mapping[str, Any]] = frame.get("by_tenant") or {}
    out = {k: v for k, v in frame.items() if k != "by_tenant"}
    out["slots"] = slot_view(frame.get("slots") or (), principal, exact)
    if principal.admin:
        if by_tenant:
            out["tenants"] = [{"tenant": tenant, **counts} for tenant, counts in by_tenant.items()]
        return out
    if "recent_instability" in out:
        out["recent_instability"] = []
    if "tokens" in out:  # a loaded model's snapshot: the totals give way to the tenant's own
        for section in SERVER_SECTIONS:
            out.pop(section, None)
        out.update(by_tenant.get(principal.tenant) or _zeros(frame))
        out["view"] = "tenant"
    if not exact:
        for section in COUNTED_TOKENS:
            out.pop(section, None)
    return out


def _zeros(frame: Mapping[str, Any]) -> dict[str, Any]:
    """The counts of a tenant without requests yet, shaped as ``frame``'s totals."""
    out: dict[str, Any] = {}
    for key in TENANT_KEYS:
        value = frame.get(key)
        out[key] = ({name: 0 for name in value} if isinstance(value, Mapping) else 0)
    return out


def props_view(props: Mapping[str, Any], principal: Principal) -> dict[str, Any]:
    """``/props`` as ``principal`` sees it: an admin's as llama-server shows it (``model_path``
    as the server was given it), another key's with the file name alone."""
    path = props.get("model_path")
    if principal.admin or not isinstance(path, str):
        return dict(props)
    return {**props, "model_path": os.path.basename(path)}


def models_view(listing: Mapping[str, Any], principal: Principal, paths: Iterable[str]
                ) -> dict[str, Any]:
    """``/v1/models`` (or ``/v1/models/{id}``'s one entry) as ``principal`` sees it: for a key
    that is not an admin's, each ``status.error`` (a failed load's message) with the model
    ``paths`` in it named by their file names (:func:`hide_paths`)."""
    if principal.admin:
        return dict(listing)
    paths = tuple(paths)
    data = listing.get("data")
    if isinstance(data, list):
        return {**listing, "data": [_entry_view(entry, paths) for entry in data]}
    return _entry_view(listing, paths)


def _entry_view(entry: Mapping[str, Any], paths: tuple[str, ...]) -> dict[str, Any]:
    status = entry.get("status")
    if not isinstance(status, Mapping) or not isinstance(status.get("error"), str):
        return dict(entry)
    return {**entry, "status": {**status, "error": hide_paths(status["error"], paths)}}


def hide_paths(text: str, paths: Iterable[str]) -> str:
    """``text`` with each of ``paths`` (as given, and as an absolute path) replaced by its
    file name, longest first."""
    spellings = {spelling for path in paths if path
                 for spelling in (path, os.path.abspath(path), os.path.realpath(path))}
    for spelling in sorted(spellings, key=len, reverse=True):
        text = text.replace(spelling, os.path.basename(spelling))
    return text
