"""API keys that carry tenants: ``--api-key-file`` lines ``KEY [TENANT [admin]]``.

A key stands for a :class:`Principal`: the tenant its requests run in (``None``: the default
tenant; KV is never reused across tenants, and a client's ``cache_scope`` is a sub-scope inside
its tenant) and whether it has an admin's view. The rules:

- **No key configured**: every request is the default tenant's, with an admin's view
  (:data:`OPEN`): the server as it always was.
- **Keys, but no line names a tenant** (``--api-key``, a file of keys alone): one tenant, every
  key an admin, as before tenants existed.
- **A line names a tenant**: tenancy is on. ``KEY TENANT`` is a tenant key, ``KEY TENANT admin``
  an admin whose requests run as TENANT, ``KEY - admin`` an admin of the default tenant, and a
  key alone (a line, or one of ``--api-key``'s) is the default tenant *without* admin rights.

What a principal may see and do (``/slots``, slot actions, the events feed, ``/metrics``) is in
:mod:`llamapy.serve.pages.tenant_view`.

The file: one key per line, fields separated by blanks; blank lines and lines whose first
non-blank character is ``#`` are ignored. A tenant name is 1 to 64 letters, digits, ``.``, ``_``
or ``-``, not starting with ``.`` (stricter than the ``tenant`` request option: it also names
the tenant's slot-file folder); ``-`` means the default tenant and ``admin`` is refused as a
name (``KEY admin`` would read as a tenant called admin: write ``KEY - admin``). A key given
twice with two meanings is an error. Every error is an
:class:`~llamapy.errors.InvalidOptionError` naming the file and line (never the key), raised at
startup, before the model loads.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..errors import InvalidOptionError, PermissionDeniedError

__all__ = ["DEFAULT_TENANT", "OPEN", "TENANT_NAME", "KeyTable", "Principal", "check_tenant_name",
           "require_admin"]

#: A tenant name in a keys file (and a tenant's slot-file folder name).
TENANT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")
#: The keys file's spelling of the default tenant.
DEFAULT_TENANT = "-"
#: The third field of an admin's line.
ADMIN = "admin"


class Principal(NamedTuple):
    """Who a request's API key stands for: its ``tenant`` (None: the default tenant) and
    whether it has an ``admin``'s view (every tenant's slots, ``/metrics``)."""

    tenant: str | None
    admin: bool

    def owns(self, tenant: str | None) -> bool:
        """Whether KV (a slot, a slot file) of ``tenant`` is this principal's own."""
        return tenant == self.tenant

    def sees(self, tenant: str | None) -> bool:
        """Whether this principal sees the details of ``tenant``'s slots (an admin: all)."""
        return self.admin or self.owns(tenant)


#: The principal of every request when no key is configured.
OPEN = Principal(None, True)


def require_admin(principal: Principal, what: str) -> Principal:
    """``principal``; :class:`PermissionDeniedError` (403) unless it is an admin's (every key
    is, unless keys carry tenants). ``what``: what it asked for, for the message. The one rule
    of what is an admin's: ``/models/load|unload`` and pulls from the Hub."""
    if not principal.admin:
        raise PermissionDeniedError(f"{what} is for admin keys only")
    return principal


def check_tenant_name(tenant: str | None, where: str, option: str = "api_key_file") -> None:
    """Raise :class:`InvalidOptionError` (naming ``where``, for ``option``) unless ``tenant``
    is None or a valid tenant name (see the module)."""
    if tenant is None:
        return
    if not isinstance(tenant, str) or not TENANT_NAME.fullmatch(tenant) or tenant in (
            DEFAULT_TENANT, ADMIN):
        raise InvalidOptionError(
            f"{where}: tenant {tenant!r} is not a tenant name (1 to 64 letters, digits, '.', "
            "'_' or '-', not starting with '.'; not '-' or 'admin')", option=option)


@dataclass(frozen=True)
class KeyTable:
    """The API keys and the :class:`Principal` of each (build it with :meth:`parse` or
    :meth:`of_keys`). Keys are non-empty and blank-free; a key listed twice must mean the same
    principal."""

    entries: tuple[tuple[str, Principal], ...]
    _encoded: tuple[tuple[bytes, Principal], ...] = field(init=False, repr=False,
                                                           compare=False)

    def __post_init__(self) -> None:
        seen: dict[str, Principal] = {}
        for index, (key, principal) in enumerate(self.entries, 1):
            where = f"api key {index}"
            if not isinstance(key, str) or not key or any(c.isspace() for c in key):
                raise InvalidOptionError(f"{where}: a key is a non-empty string without blanks",
                                         option="api_keys")
            check_tenant_name(principal.tenant, where, "api_keys")
            if seen.setdefault(key, principal) != principal:
                raise InvalidOptionError(f"{where}: the key is listed before with another "
                                         "tenant or role", option="api_keys")
        object.__setattr__(self, "_encoded",
                           tuple((key.encode(), principal) for key, principal in self.entries))

    @classmethod
    def of_keys(cls, keys: str | Iterable[str]) -> KeyTable:
        """Plain keys (a comma-separated string, as ``--api-key`` takes them, or an iterable):
        one tenant, every key an admin."""
        items = keys.split(",") if isinstance(keys, str) else keys
        return cls(tuple((key.strip(), OPEN) for key in items if key.strip()))

    @classmethod
    def parse(cls, text: str, *, source: str = "api key file", plain: Iterable[str] = ()
              ) -> KeyTable:
        """The table of a keys file's ``text`` (``source`` names it in errors) plus ``plain``
        keys (``--api-key``'s, read as lines of a key alone); see the module for the rules."""
        lines = [("--api-key", [key.strip()]) for key in plain if key.strip()]
        lines += [(f"{source} line {number}", line.split())
                  for number, line in enumerate(text.splitlines(), 1)
                  if line.strip() and not line.lstrip().startswith("#")]
        tenancy = any(len(fields) > 1 for _, fields in lines)
        first: dict[str, tuple[Principal, str]] = {}
        entries: list[tuple[str, Principal]] = []
        for where, fields in lines:
            principal = _principal(fields, tenancy, where)
            before = first.setdefault(fields[0], (principal, where))
            if before[0] != principal:
                raise InvalidOptionError(f"{where}: the key is already given ({before[1]}) with "
                                         "another tenant or role", option="api_key_file")
            if before[1] == where:
                entries.append((fields[0], principal))
        return cls(tuple(entries))

    @property
    def tenants(self) -> frozenset[str]:
        """The tenants named (the default tenant is not a name)."""
        return frozenset(p.tenant for _, p in self.entries if p.tenant is not None)

    @property
    def tenancy(self) -> bool:
        """Whether keys carry tenants (some key is not an admin of the default tenant)."""
        return any(principal != OPEN for _, principal in self.entries)

    def match(self, offered: Sequence[str]) -> Principal | None:
        """The principal of the first ``offered`` key in the table (None: none is). Every
        offered key is compared with every key in constant time, whatever matches."""
        found: Principal | None = None
        for token in offered:
            given = token.encode()
            for key, principal in self._encoded:
                if secrets.compare_digest(given, key) and found is None:
                    found = principal
        return found


def _principal(fields: list[str], tenancy: bool, where: str) -> Principal:
    """The principal of one line's fields (``KEY [TENANT [admin]]``)."""
    if len(fields) > 3 or (len(fields) == 3 and fields[2] != ADMIN):
        raise InvalidOptionError(f"{where}: expected 'KEY', 'KEY TENANT' or 'KEY TENANT admin'",
                                 option="api_key_file")
    if len(fields) == 1:
        return Principal(None, not tenancy)
    if fields[1] == ADMIN:
        raise InvalidOptionError(
            f"{where}: 'admin' is not a tenant name: write 'KEY TENANT admin' for a tenant's "
            "admin, 'KEY - admin' for the default tenant's", option="api_key_file")
    tenant = None if fields[1] == DEFAULT_TENANT else fields[1]
    check_tenant_name(tenant, where)
    return Principal(tenant, len(fields) == 3)
