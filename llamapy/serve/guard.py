"""Guards against requests a web page makes a browser send.

A server on loopback without an API key is still reachable by every page its user opens: a
page may send a "simple" cross-origin request (``GET``, or ``POST`` with a ``text/plain``,
``multipart/form-data`` or form-urlencoded body, or none) without a preflight; CORS only hides
the answer from it. A DNS-rebinding page (its own name re-pointed at ``127.0.0.1``) is even
same-origin and reads the answers. :class:`BrowserGuard` refuses, before any route runs:

- **a foreign ``Host``** (403, :class:`~llamapy.errors.HostNotAllowedError`): allowed are
  ``localhost``, any IP literal (``127.0.0.1``, ``[::1]``, a LAN address: a rebinding page
  always uses a name), the names the server binds (``--host NAME``) and ``--allowed-hosts``
  (exact names, ``.example.com`` for a domain and its subdomains, ``*`` for any host); any
  port. A server bound to every interface (``0.0.0.0`` or ``::``) was exposed on purpose, and
  is reached under names nobody listed (a cluster's service name, a gateway's): it answers any
  ``Host`` unless ``--allowed-hosts`` is given, which then applies (plus the machine's own
  name). That leaves a container whose ``0.0.0.0`` is published on the host's loopback only
  open to rebinding pages: give it ``--allowed-hosts localhost``. A request without ``Host``
  (HTTP/1.0) is not a browser's and passes.
- **a cross-origin page's request that may change state** (any method but ``GET``, ``HEAD``
  and ``OPTIONS``; 403, :class:`~llamapy.errors.OriginNotAllowedError`) from an origin that
  ``--cors-origins`` does not allow. Same-origin requests (the ``Origin``'s host and port are
  the request's ``Host``: the pages served here) and requests without ``Origin`` (not from a
  browser, which always sends it on a cross-origin ``POST``) pass. A WebSocket handshake is
  checked as such a request (CORS does not cover WebSockets: a browser lets any page open
  one), and refused with a denial response (or a close, 1008).
- **a body that is not JSON** on such a method (415,
  :class:`~llamapy.errors.UnsupportedMediaTypeError`): ``application/json`` and
  ``application/*+json``, with any parameters (``charset``). Two more are taken, as
  llama-server takes them, from a request that passed the ``Origin`` check (so without
  ``Origin`` or from an allowed one): ``application/x-www-form-urlencoded``, what ``curl -d``
  sends by default, and no ``Content-Type`` at all (``requests.post(url, data=text)``); the
  body is read as JSON regardless. No route takes ``multipart/form-data`` or ``text/plain``.

Refusals answer in the route's own error shape (Anthropic's on its routes, else OpenAI's,
which llama-server's routes share), mapped by exception type. Preflights (``OPTIONS``) are
answered earlier by :mod:`llamapy.serve.cors`, as llama-server answers them. Every response
that passes here carries ``X-Content-Type-Options: nosniff`` and :data:`CSP`: the pages load
their scripts and styles from ``/static`` only (no inline script, style or handler), may not
be framed (``frame-ancestors 'none'``) and talk to this server only.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from ..errors import (
    HostNotAllowedError,
    LlamapyError,
    OriginNotAllowedError,
    UnsupportedMediaTypeError,
)
from .cors import CorsPolicy
from .errors import refuse_websocket
from .routing import ErrorShape

__all__ = ["CSP", "SAFE_METHODS", "BrowserGuard", "HostPolicy", "is_json_type", "same_origin"]

#: Methods that change nothing: never refused for their ``Origin`` or body.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Host names that always mean this machine.
LOCAL_NAMES = frozenset({"localhost"})
#: Bind addresses meaning every interface.
ALL_INTERFACES = frozenset({"", "0.0.0.0", "::", "*"})
#: Body types taken from a request that passed the ``Origin`` check besides JSON ("" = none).
CLI_TYPES = frozenset({"", "application/x-www-form-urlencoded"})
#: The Content-Security-Policy of every response (the pages' scripts and styles are files).
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
#: Headers added to every response.
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}

def host_name(value: str) -> str:
    """The name of a ``Host`` header (or an origin's authority): port and brackets dropped,
    lower case, no trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):
        name = value[1:value.find("]")] if "]" in value else value[1:]
    else:
        name = value.rpartition(":")[0] if ":" in value else value
    return name.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostPolicy:
    """Which ``Host`` names the server answers to (see the module): ``allowed`` as
    ``--allowed-hosts`` gives them, ``bound`` the addresses the server listens on."""

    def __init__(self, allowed: Iterable[str] = (), bound: Iterable[str] = ()) -> None:
        names = {name.strip().lower().rstrip(".")
                 for value in allowed for name in value.split(",")}
        names.discard("")
        bound_names = {address.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")
                       for address in bound}
        exposed = not bound_names.isdisjoint(ALL_INTERFACES)
        self.any = "*" in names or (exposed and not names)
        self.domains = tuple(name for name in names if name.startswith("."))
        exact = {name for name in names | bound_names
                 if not name.startswith(".") and not _is_ip(name)} - ALL_INTERFACES
        if exposed:
            exact.add(socket.gethostname().lower())
        self.exact = frozenset(exact | LOCAL_NAMES)

    def allows(self, host: str) -> bool:
        """Whether a request with this ``Host`` header value is answered."""
        name = host_name(host)
        return (self.any or name in self.exact or _is_ip(name)
                or any(name.endswith(domain) or name == domain[1:] for domain in self.domains))


def same_origin(origin: str, host: str) -> bool:
    """Whether ``origin`` (an ``Origin`` header) is the request's own: its host and port are
    the ``Host`` header's (the scheme is not compared: a proxy may end TLS in front)."""
    _, sep, authority = origin.partition("://")
    return bool(sep and host) and authority.lower() == host.strip().lower()


def is_json_type(content_type: str) -> bool:
    """Whether a ``Content-Type`` is JSON: ``application/json`` or ``application/*+json``,
    parameters allowed."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def _body_refusal(headers: Headers) -> UnsupportedMediaTypeError | None:
    """The refusal of a body that is not JSON, for a request that passed the ``Origin`` check
    (none, same-origin or allowed), so a command line's types pass too (:data:`CLI_TYPES`)."""
    if headers.get("content-length", "0").strip() == "0" and "transfer-encoding" not in headers:
        return None  # no body
    content_type = headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if is_json_type(media) or media in CLI_TYPES:
        return None
    return UnsupportedMediaTypeError(content_type)


class BrowserGuard:
    """ASGI middleware: refuses a foreign ``Host``, a disallowed cross-origin request that may
    change state and a body that is not JSON (see the module) with ``shape`` (the route's
    error shape); adds :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp, hosts: HostPolicy, origins: CorsPolicy,
                 shape: ErrorShape) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins
        self.shape = shape

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self.handshake(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    out.setdefault(name, value)
            await send(message)

        refusal = self.refusal(Headers(scope=scope), scope["method"])
        if refusal is not None:
            await self.shape(Request(scope), refusal)(scope, receive, send_secured)
            return
        await self.app(scope, receive, send_secured)

    async def handshake(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket handshake: refused as a request that may change state (CORS does not
        cover WebSockets: a page of any origin may open one), in the OpenAI shape (the
        WebSocket routes are OpenAI's), with a denial response where the server sends them,
        else a close (1008)."""
        refusal = self.refusal(Headers(scope=scope), "WEBSOCKET")
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await refuse_websocket(WebSocket(scope, receive, send), refusal)

    def refusal(self, headers: Headers, method: str) -> LlamapyError | None:
        """Why a request with these headers is refused, or None."""
        host = headers.get("host", "")
        if host and not self.hosts.allows(host):
            return HostNotAllowedError(host)
        if method in SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and not (same_origin(origin, host) or self.origins.allows(origin)):
            return OriginNotAllowedError(origin)
        return _body_refusal(headers)
