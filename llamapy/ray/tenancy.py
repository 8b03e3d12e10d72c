"""The tenant of a request reaching the ingress, so that its routing key is scoped by it.

With an API key file whose lines name tenants (``KEY TENANT [admin]``), a request's KV is its
tenant's: the engine never reuses it across tenants. The routing must not cross them either:
the ingress seeds a request's routing key with its tenant (:func:`~llamapy.ray.keys.routing_key`),
so a session, a ``cache_scope`` or a prompt of one tenant never finds, moves or counts
another's entries in the router's table, and replica stats name scopes by opaque ids only.

The ingress asks a :data:`TenantOf`: ``tenant_of(headers)`` is the tenant of the request's
API key (None: the default tenant) and raises :class:`~llamapy.errors.AuthenticationError`
when the request carries no key of the table. The ingress refuses such a request before it
reads its body, unless it is a bodiless ``GET`` (relayed routed by load, leaving nothing in
the table: the replica serves its open routes and answers the 401 elsewhere), so a caller
without a key neither makes the ingress read a body nor moves anyone's session. Each replica's
app checks the keys again.

:class:`KeyTenants` is the :data:`TenantOf` of a key table: any object with
``match(offered_keys) -> principal | None`` whose principal has a ``tenant`` (the serve
layer's table, the ``api_keys`` keyword of :func:`~llamapy.serve.create_app`, is one).
:func:`tenant_lookup` finds it among the app's keywords, as the replicas receive them (plain
``api_key`` strings too: their table is one tenant's), so the ingress reads the same keys as
the replicas. Nothing here imports Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import AuthenticationError

__all__ = ["KeyMatcher", "KeyTenants", "TenantOf", "offered_keys", "tenant_lookup"]

#: The tenant of a request's headers (see the module).
TenantOf = Callable[[Mapping[str, str]], "str | None"]


class KeyMatcher(Protocol):
    """A key table: the principal (with a ``tenant``) of the first offered key it holds."""

    def match(self, offered: Sequence[str]) -> Any:
        """The principal of the first key of ``offered`` in the table, None if none is."""


def offered_keys(headers: Mapping[str, str]) -> list[str]:
    """The API keys a request offers: ``Authorization: Bearer KEY`` and ``x-api-key: KEY``
    (lower-case header names), as the server reads them."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    offered = [token.strip()] if scheme.lower() == "bearer" and token.strip() else []
    key = headers.get("x-api-key", "").strip()
    return [*offered, key] if key else offered


@dataclass(frozen=True)
class KeyTenants:
    """The :data:`TenantOf` of a key table."""

    keys: KeyMatcher

    def __call__(self, headers: Mapping[str, str]) -> str | None:
        """The tenant of the request's key (None: the default tenant); raises
        :class:`AuthenticationError` when it offers no key of the table."""
        principal = self.keys.match(offered_keys(headers))
        if principal is None:
            raise AuthenticationError("no API key of this deployment")
        tenant = getattr(principal, "tenant", None)
        return None if tenant is None else str(tenant)


def tenant_lookup(app_options: Mapping[str, Any]) -> TenantOf | None:
    """The :data:`TenantOf` of the replicas' app keywords: their ``api_keys`` table, or the
    table of their plain ``api_key`` keys (comma-separated; no tenants: every request is the
    default tenant's, as before tenants); None without keys (the ingress then authenticates
    nothing, as the replicas do not)."""
    table: Any = app_options.get("api_keys")
    if callable(getattr(table, "match", None)):
        return KeyTenants(table)
    plain = app_options.get("api_key")
    if not isinstance(plain, str):
        return None
    from ..serve.tenants import KeyTable

    keys = KeyTable.of_keys(plain)
    return KeyTenants(keys) if keys.entries else None
