"""Remote media: an ``http(s)`` URL fetched from the very addresses it was checked for.

The policy, one hop at a time (the URL, then each redirect, at most :data:`MAX_REDIRECTS`,
followed here and not by httpx):

1. The host is resolved once (:func:`resolve`, the system resolver through the event loop).
2. Every address it has must pass :func:`address_allowed` (unless the server allows private
   addresses: ``--media-remote-private``); one refused address refuses the hop.
3. The request goes to those addresses (the next one only while one refuses the connection,
   at most :data:`MAX_ADDRESSES`): its URL names the address instead of the host, its
   ``Host`` header is the URL's own host (and port), and for ``https`` the ``sni_hostname``
   request extension (httpx hands it to httpcore) sends the host's name in TLS and checks
   the certificate against that name, not the address.

Nothing resolves the name a second time, so a name that answers a public address to the check
and a loopback one to the connection (DNS rebinding) reaches the public one or nothing; and a
spelling of an address (``2130706433``, ``0x7f.1``, ``127.1``) is judged as what the resolver
makes of it, since that address is the one connected to. Rewriting the URL is the way httpx's
public API offers: its transport takes no network backend to pin a connection with, while the
``Host`` header and ``sni_hostname`` are documented request parts. The client reads no proxy or
credentials from the environment (``trust_env=False``): a proxy would resolve the name again.

Allowed addresses (:func:`address_allowed`): IPv4 that Python's :mod:`ipaddress` calls global,
not multicast; IPv6 global unicast (``2000::/3``) that is global and none of the forms that
carry or reach an IPv4 address (NAT64 ``64:ff9b::/96`` and ``64:ff9b:1::/48``, 6to4
``2002::/16``, Teredo ``2001::/32``, IPv4-compatible ``::/96``); an IPv4-mapped address
(``::ffff:a.b.c.d``) is judged as its IPv4 address.

Whatever fails (a URL httpx cannot parse, a name that does not resolve, a refused address, a
connection or TLS error, the time limit, a body past the size limit, a status that is not a
2xx, too many redirects) is one :class:`~llamapy.errors.MediaError` with one message,
:data:`FETCH_FAILED`: the answer tells a client nothing of the server's network (which names
resolve, to what, what listens). The detail goes to this module's logger at INFO.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from llamapy.errors import MediaError

if TYPE_CHECKING:
    import httpx

    from .sources import MediaFetch

__all__ = ["FETCH_FAILED", "MAX_ADDRESSES", "MAX_REDIRECTS", "address_allowed", "download",
           "pinned_request", "resolve"]

_log = logging.getLogger(__name__)

#: The one message of a remote URL that could not be fetched, whatever the cause.
FETCH_FAILED = "the media URL could not be fetched"
#: Redirects followed for one URL (each checked as the URL itself is).
MAX_REDIRECTS = 3
#: Addresses of a name tried in turn while they refuse the connection.
MAX_ADDRESSES = 4
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: IPv6 forms that carry or reach an IPv4 address: refused whatever they embed.
_IPV4_CARRIERS = tuple(ipaddress.IPv6Network(n) for n in (
    "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32", "::/96"))
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class _Refused(Exception):
    """A hop this module will not fetch; its text goes to the log only."""


def address_allowed(address: Address) -> bool:
    """Whether a remote fetch may connect to ``address`` (see the module)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address_allowed(address.ipv4_mapped)
        if address not in _GLOBAL_UNICAST or any(address in n for n in _IPV4_CARRIERS):
            return False
    return address.is_global and not address.is_multicast


async def resolve(host: str, port: int) -> list[Address]:
    """The addresses of ``host``, by the system resolver (an address in any spelling it
    takes gives that address); :class:`OSError` when it has none."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0]) for info in infos]


def download(url: str, fetch: MediaFetch, where: str) -> bytes:
    """GET ``url`` within ``fetch.max_bytes`` and ``fetch.timeout_s`` for the whole download
    (headers included: an event loop's deadline cancels whatever read is under way; a
    per-read timeout would let a server that sends a byte now and then hold the thread);
    :class:`~llamapy.errors.MediaError` with :data:`FETCH_FAILED` for any failure."""
    work = _within_limits(url, fetch, where)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: a worker thread
        return asyncio.run(work)
    with ThreadPoolExecutor(1) as pool:  # called on an event loop's thread: not that loop
        return pool.submit(asyncio.run, work).result()


async def _within_limits(url: str, fetch: MediaFetch, where: str) -> bytes:
    import httpx

    try:
        return await asyncio.wait_for(_fetch(httpx.URL(url), fetch), fetch.timeout_s)
    except (_Refused, TimeoutError, asyncio.TimeoutError, OSError, ValueError,
            httpx.HTTPError, httpx.InvalidURL) as exc:  # (asyncio's is its own before 3.11)
        _log.info("remote media not fetched (%s): %s: %s", _host_of(url),
                  type(exc).__name__, exc)
        raise MediaError(f"{where}: {FETCH_FAILED}", reason="remote") from None


def _host_of(url: str) -> str:
    """The host part of ``url`` for the log (not its path or query: they may hold a token)."""
    return url.partition("://")[2].partition("/")[0].rpartition("@")[2][:300]


async def _fetch(url: httpx.URL, fetch: MediaFetch) -> bytes:
    """The body of ``url``, following redirects itself, each hop pinned (see the module)."""
    import httpx

    async with httpx.AsyncClient(timeout=fetch.timeout_s, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            addresses = await _checked_addresses(url, fetch.private)
            response = await _send(client, url, addresses)
            try:
                location = response.headers.get("location")
                if response.status_code in _REDIRECTS and location is not None:
                    url = url.join(location)
                    continue
                if not 200 <= response.status_code < 300:
                    raise _Refused(f"HTTP {response.status_code}")
                return await _body(response, fetch.max_bytes)
            finally:
                await response.aclose()
    raise _Refused(f"more than {MAX_REDIRECTS} redirects")


async def _checked_addresses(url: httpx.URL, private: bool) -> list[Address]:
    """The addresses to connect to for ``url``: its host's, all of them allowed (any, when
    ``private``), at most :data:`MAX_ADDRESSES`."""
    if url.scheme not in _DEFAULT_PORTS or not url.raw_host:
        raise _Refused(f"not an http(s) URL with a host: {url.scheme!r}")
    host = url.raw_host.decode("ascii")
    addresses = await resolve(host, url.port or _DEFAULT_PORTS[url.scheme])
    refused = [str(a) for a in addresses if not (private or address_allowed(a))]
    if refused or not addresses:
        raise _Refused(f"{host!r} resolves to {', '.join(refused) or 'nothing'}: not public "
                       "(--media-remote-private allows private addresses)")
    return addresses[:MAX_ADDRESSES]


async def _send(client: httpx.AsyncClient, url: httpx.URL, addresses: list[Address]
                ) -> httpx.Response:
    """The response of the first of ``addresses`` that takes the connection."""
    import httpx

    for address in addresses[:-1]:
        try:
            return await client.send(pinned_request(client, url, address), stream=True)
        except httpx.ConnectError as exc:
            _log.debug("remote media: %s did not connect: %s", address, exc)
    return await client.send(pinned_request(client, url, addresses[-1]), stream=True)


def pinned_request(client: httpx.AsyncClient, url: httpx.URL, address: Address
                   ) -> httpx.Request:
    """A GET of ``url`` sent to ``address``: the URL's host in the ``Host`` header and, for
    ``https``, in TLS (SNI and the certificate check)."""
    extensions = {"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else {}
    headers = {"Host": url.netloc.decode("ascii"), "Accept-Encoding": "identity"}
    return client.build_request("GET", url.copy_with(host=str(address)), headers=headers,
                                extensions=extensions)


async def _body(response: httpx.Response, max_bytes: int) -> bytes:
    """The body as sent, within ``max_bytes``: an encoded one is refused (identity was asked
    for, and a compressed body could expand past any bound inside one decode)."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise _Refused(f"a body in content-encoding {encoding[:40]!r}")
    data = bytearray()
    async for chunk in response.aiter_raw():
        data += chunk
        if len(data) > max_bytes:
            raise _Refused(f"more than the {max_bytes} bytes allowed")
    return bytes(data)
