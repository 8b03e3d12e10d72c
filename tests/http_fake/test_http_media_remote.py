"""Remote media URLs (``--media-remote``) reach the addresses they were checked for, and nothing
else: a name is resolved once and its checked address connected to (DNS rebinding reaches
nothing inside), every redirect is checked as the URL is, the IPv6 forms that carry an IPv4
address and the odd spellings of an IPv4 address are judged as the address they reach, and
every failure is one 400 with one message.

The tests stay on 127.0.0.1 with two stand-ins (:func:`network`): the resolver
(``socket.getaddrinfo``, under the event loop's ``getaddrinfo`` and httpx's own connection)
answers the test names from :data:`NAMES` and every other name as a numeric address only (no
DNS query leaves the machine); and httpx's transport takes :data:`PUBLIC`, a global address,
to the local :class:`_Site` with a :data:`VIA` header. So the site tells a request that came
"from the internet" from one that reached it on loopback: the latter must never happen
without ``--media-remote-private``.
"""

from __future__ import annotations

import gzip
import http.server
import ipaddress
import logging
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from fake_http import FakeApp

from llamapy.errors import MediaError
from llamapy.media.remote import FETCH_FAILED, MAX_REDIRECTS, address_allowed, pinned_request
from llamapy.media.samples import png
from llamapy.media.sources import MediaFetch, media_from_url

RED = png(8, 8, (255, 0, 0))
BOMB = gzip.compress(gzip.compress(b"\0" * 10_000_000))
#: A global address; the stand-in internet answers it from the local site.
PUBLIC = "93.184.215.14"
#: A global address that refuses every connection on the stand-in internet.
DEAD = "93.184.215.15"
#: The header the stand-in internet adds: the request reached the site as :data:`PUBLIC`.
VIA = "X-Stand-In-Internet"
#: The stand-in resolver's names: successive answers (the last one repeats).
NAMES = {
    "public.test": [[PUBLIC]],
    "rebind.test": [[PUBLIC], ["127.0.0.1"]],
    "mixed.test": [[PUBLIC, "10.0.0.5"]],
    "nat64.test": [["64:ff9b::7f00:1"]],
    "sixtofour.test": [["2002:7f00:1::1"]],
    "media.test": [["127.0.0.1"]],
    "twohomes.test": [[DEAD, PUBLIC]],
}


@dataclass
class Network:
    """What the stand-ins saw: lookups by name, the hosts httpx connected to, and the site's
    requests as (path, Host header, came through the stand-in internet)."""

    lookups: Counter[str] = field(default_factory=Counter)
    connects: list[str] = field(default_factory=list)
    seen: list[tuple[str, str, bool]] = field(default_factory=list)
    port: int = 0

    def from_loopback(self) -> list[tuple[str, str, bool]]:
        """The site's requests that reached it on loopback, not as the public address."""
        return [s for s in self.seen if not s[2]]


class _Site(http.server.BaseHTTPRequestHandler):
    """An image host: ``/red.png``, ``/to?<url>`` (a redirect there), ``/loop`` (a redirect
    to itself), anything else a 404."""

    network: Network

    def do_GET(self) -> None:
        self.network.seen.append((self.path, self.headers["Host"], self.headers.get(VIA) == "1"))
        path, _, query = self.path.partition("?")
        if path == "/red.png":
            self._send(200, RED)
        elif path == "/bomb.png":  # gzip of gzip: a few bytes that decode to far more
            self._send(200, BOMB, encoding="gzip, gzip")
        elif path in ("/to", "/loop"):
            self._send(302, b"", unquote(query) if path == "/to" else "/loop")
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes, location: str | None = None,
              encoding: str | None = None) -> None:
        self.send_response(status)
        if location is not None:
            self.send_header("Location", location)
        if encoding is not None:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def site() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


@pytest.fixture
def network(site: http.server.ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch) -> Network:
    """The stand-in resolver and internet (see the module) around the local site."""
    net = Network(port=site.server_address[1])
    _Site.network = net
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0,
                    flags: int = 0) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in NAMES:
            return real_getaddrinfo(host, port, family, type, proto,
                                    flags | socket.AI_NUMERICHOST)
        answers = NAMES[name]
        net.lookups[name] += 1
        answer = answers[min(net.lookups[name], len(answers)) - 1]
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, int(port or 0))) for a in answer]

    original = httpx.AsyncHTTPTransport.handle_async_request

    async def routed(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        net.connects.append(request.url.host)
        if request.url.host == DEAD:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.host == PUBLIC:
            headers = request.headers.copy()
            headers[VIA] = "1"
            request = httpx.Request(request.method, request.url.copy_with(host="127.0.0.1"),
                                    headers=headers, extensions=request.extensions)
        return await original(self, request)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", routed)
    return net


def fetch(url: str, private: bool = False) -> bytes:
    return media_from_url(url, MediaFetch(4000, remote=True, timeout_s=5, private=private),
                          "image")


def refused(url: str) -> str:
    """The message of a fetch of ``url`` (public addresses only) that must fail."""
    with pytest.raises(MediaError) as caught:
        fetch(url)
    assert caught.value.reason == "remote"
    return str(caught.value)


def test_a_rebinding_name_is_fetched_from_the_address_checked(network: Network) -> None:
    """The name answers a public address, then loopback: the one lookup's public address is
    the one connected to, under the name's own Host header; loopback is never reached."""
    url = f"http://rebind.test:{network.port}/red.png"
    assert fetch(url) == RED
    assert network.lookups["rebind.test"] == 1
    assert network.connects == [PUBLIC]
    assert network.seen == [("/red.png", f"rebind.test:{network.port}", True)]
    assert fetch(url.replace("rebind", "public")) == RED  # its next answer would be loopback
    assert network.from_loopback() == []


def test_an_encoded_body_is_refused_unread(network: Network,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """Identity is asked for; a compressed body (which could expand past any bound within one
    decode) is the one 400, refused for its encoding before any of it is decoded."""
    with caplog.at_level(logging.INFO, logger="llamapy.media.remote"):
        assert "could not be fetched" in refused(f"http://public.test:{network.port}/bomb.png")
    assert "content-encoding 'gzip, gzip'" in caplog.text
    assert network.from_loopback() == []


def test_the_next_address_is_tried_when_one_refuses_the_connection(network: Network) -> None:
    assert fetch(f"http://twohomes.test:{network.port}/red.png") == RED
    assert network.connects == [DEAD, PUBLIC]
    assert network.lookups["twohomes.test"] == 1


def test_each_redirect_is_checked_like_the_url(network: Network) -> None:
    port = network.port
    assert fetch(f"http://public.test:{port}/to?/red.png") == RED  # a relative redirect
    assert [s[0] for s in network.seen] == ["/to?/red.png", "/red.png"]
    for target in (f"http://127.0.0.1:{port}/red.png", f"http://[::ffff:127.0.0.1]:{port}/",
                   f"http://2130706433:{port}/red.png", f"http://rebind.test:{port}/red.png",
                   f"http://mixed.test:{port}/red.png", f"http://nat64.test:{port}/",
                   "file:///etc/passwd", "http://nowhere.test/"):
        network.lookups.clear()
        network.lookups["rebind.test"] = 1  # its next answer is loopback
        assert refused(f"http://public.test:{port}/to?{target}") == f"image: {FETCH_FAILED}"
    assert network.from_loopback() == []
    network.seen.clear()
    assert refused(f"http://public.test:{port}/loop") == f"image: {FETCH_FAILED}"
    assert len(network.seen) == MAX_REDIRECTS + 1


@pytest.mark.parametrize("url", [
    "http://nowhere.test/red.png",  # does not resolve
    "http://mixed.test:{port}/red.png",  # one of its addresses is private
    "http://nat64.test:{port}/red.png", "http://sixtofour.test:{port}/red.png",
    "http://127.0.0.1:{port}/red.png", "http://10.0.0.1/", "http://169.254.169.254/latest",
    "http://0177.0.0.1:{port}/red.png", "http://2130706433:{port}/red.png",
    "http://0x7f.1:{port}/red.png", "http://127.1:{port}/red.png", "http://0/",
    "http://017700000001:{port}/red.png", "https://0177.0.0.1/",
    "http://[::ffff:127.0.0.1]:{port}/red.png", "http://[::127.0.0.1]:{port}/",
    "http://[64:ff9b::7f00:1]/", "http://[64:ff9b:1::a00:1]/", "http://[2002:7f00:1::1]/",
    "http://[2001::1]/", "http://[::1]:{port}/", "http://[fe80::1]/", "http://[ff02::1]/",
    "http://64:ff9b::7f00:1/", "http://[::1/", "http:///red.png", "http://:80/",
    "http://x:99999/", "http://public.test:{port}/missing.png",  # a 404
])
def test_every_failure_is_one_400_message(network: Network, url: str) -> None:
    """Whether the name resolved, to what, or how the fetch failed: one message."""
    assert refused(url.format(port=network.port)) == f"image: {FETCH_FAILED}"
    assert network.from_loopback() == []


def test_the_detail_is_logged(network: Network, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="llamapy.media.remote"):
        refused(f"http://mixed.test:{network.port}/red.png")
    assert "10.0.0.5" in caplog.text and "mixed.test" in caplog.text


def test_private_addresses_are_fetched_when_allowed(network: Network) -> None:
    """With ``--media-remote-private`` the same spellings reach loopback (so the refusals
    above are of the address, not of the spelling), under their own Host header."""
    port = network.port
    for host in ("media.test", "127.0.0.1", "2130706433", "0x7f.1", "127.1"):
        network.seen.clear()
        assert fetch(f"http://{host}:{port}/red.png", private=True) == RED
        assert network.seen == [("/red.png", f"{host}:{port}", False)]
    assert fetch(f"http://media.test:{port}/to?/red.png", private=True) == RED


def test_a_pinned_request_keeps_the_host_name() -> None:
    """The request goes to the address; the name stays in Host and, for https, in TLS."""
    client = httpx.AsyncClient()
    address = ipaddress.ip_address("2606:2800:220:1::1")
    request = pinned_request(client, httpx.URL("https://media.test:8443/a.png?b=1"), address)
    assert str(request.url) == "https://[2606:2800:220:1::1]:8443/a.png?b=1"
    assert request.headers["host"] == "media.test:8443"
    assert request.extensions["sni_hostname"] == "media.test"
    plain = pinned_request(client, httpx.URL("http://media.test/a.png"), address)
    assert plain.headers["host"] == "media.test" and "sni_hostname" not in plain.extensions


@pytest.mark.parametrize(("address", "allowed"), [
    ("93.184.215.14", True), ("2606:2800:220:1::1", True), ("::ffff:93.184.215.14", True),
    ("127.0.0.1", False), ("10.1.2.3", False), ("169.254.169.254", False),
    ("100.64.0.1", False), ("0.0.0.0", False), ("224.0.0.1", False), ("239.1.2.3", False),
    ("255.255.255.255", False), ("::1", False), ("::", False), ("fe80::1", False),
    ("fc00::1", False), ("ff0e::1", False), ("::ffff:127.0.0.1", False),
    ("::ffff:10.0.0.1", False), ("::127.0.0.1", False), ("::93.184.215.14", False),
    ("64:ff9b::7f00:1", False), ("64:ff9b::5db8:d70e", False), ("64:ff9b:1::1", False),
    ("2002:7f00:1::1", False), ("2002:5db8:d70e::1", False), ("2001::1", False),
    ("2001:db8::1", False),
])
def test_which_addresses_are_public(address: str, allowed: bool) -> None:
    assert address_allowed(ipaddress.ip_address(address)) is allowed


def test_remote_urls_are_400s_with_one_message_on_every_api(network: Network) -> None:
    """Through the app: never a 500, and the same answer for a name that does not resolve,
    a refused address and a URL httpx cannot parse."""
    port = network.port
    urls = ("http://0177.0.0.1/", f"http://0177.0.0.1:{port}/red.png",
            f"http://[::ffff:127.0.0.1]:{port}/red.png", "http://64:ff9b::7f00:1/",
            "http://[64:ff9b::7f00:1]/", f"http://rebind.test:{port}/missing.png",
            "http://nowhere.test/red.png", f"http://2130706433:{port}/red.png",
            "http://[2002:7f00:1::1]/", "http://x:99999/")
    with FakeApp(options={"mmproj": "fake"}, app_options={"media_remote": True}) as app:
        messages = set()
        for url in urls:
            body = {"max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}]}]}
            answer = app.send("POST", "/v1/chat/completions", json=body)
            assert answer.status_code == 400, (url, answer.text)
            messages.add(answer.json()["error"]["message"])
        assert len(messages) == 1 and FETCH_FAILED in messages.pop()
        good = {"max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"http://public.test:{port}/red.png"}}]}]}
        assert app.send("POST", "/v1/chat/completions", json=good).status_code == 200
        app.check_idle()
    assert network.from_loopback() == []
