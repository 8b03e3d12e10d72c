"""Requests a web page can make a browser send are refused (:mod:`llamapy.serve.guard`).

No model: the app's model never finishes loading, so a request the guards let through reaches
its route and answers 503 ("loading model"), while a refused one answers 403 or 415 in the
route's own error shape. One test runs the issue's request on the live app.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest
from http_helpers import chat
from live import LiveApp
from starlette.applications import Starlette
from starlette.testclient import TestClient

from llamapy.errors import LoadFailedError
from llamapy.serve import create_app
from llamapy.serve.app import STATIC_DIR
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.serving import app_options
from llamapy.serve.guard import HostPolicy, is_json_type, same_origin
from llamapy.server import Server

#: Where the test clients say they are (the ``Host`` they send).
LOCAL = "http://127.0.0.1:8080"
BODY = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
MESSAGES_BODY = b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}'
EVIL = "http://evil.example"


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def make(gate: threading.Event) -> Any:
    """``make(**create_app options)``: a client (on :data:`LOCAL`) of an app whose model never
    loads."""
    def load() -> Server:
        gate.wait(60)
        raise LoadFailedError(RuntimeError("test over"))

    def client(base_url: str = LOCAL, **options: Any) -> TestClient:
        app: Starlette = create_app(load, **options)  # type: ignore[arg-type]
        return TestClient(app, base_url=base_url)

    return client


def post(client: TestClient, path: str, content_type: str | None, origin: str | None = None,
         body: bytes = BODY, **headers: str) -> httpx.Response:
    if content_type is not None:
        headers["Content-Type"] = content_type
    if origin is not None:
        headers["Origin"] = origin
    return client.post(path, content=body, headers=headers)


def openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def anthropic_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error"
    error: dict[str, Any] = body["error"]
    return error


def passed(response: httpx.Response) -> bool:
    """The guards let it through: the route answered (its model is loading)."""
    return response.status_code == 503


def test_a_body_that_is_not_json_is_a_415_in_the_routes_shape(make: Any) -> None:
    client = make()
    for content_type in ("text/plain", "text/plain;charset=UTF-8", "multipart/form-data; b=x",
                         "application/xml"):
        for path in ("/v1/chat/completions", "/completion", "/tokenize", "/v1/responses"):
            error = openai_error(post(client, path, content_type), 415)
            assert error["code"] == "unsupported_media_type", (path, content_type)
            assert error["type"] == "invalid_request_error"
        error = anthropic_error(post(client, "/v1/messages", content_type, body=MESSAGES_BODY),
                                415)
        assert error["type"] == "invalid_request_error"


def test_json_types_pass_and_so_do_a_command_lines_without_a_foreign_origin(make: Any) -> None:
    client = make()
    for content_type in ("application/json", "Application/JSON; charset=utf-8",
                         "application/vnd.api+json", "application/x-www-form-urlencoded", None):
        assert passed(post(client, "/v1/chat/completions", content_type)), content_type
        assert passed(post(client, "/v1/chat/completions", content_type,
                           origin="http://localhost:5173")), content_type
    assert passed(post(client, "/v1/messages", "application/json", body=MESSAGES_BODY))
    # no body: nothing to type (a bodiless POST is still checked for its Origin)
    assert post(client, "/v1/chat/completions", "text/plain", body=b"").status_code == 400


def test_a_foreign_origin_may_not_send_what_changes_state(make: Any) -> None:
    client = make()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None,
                         "application/json"):
        error = openai_error(post(client, "/v1/chat/completions", content_type, origin=EVIL),
                             403)
        assert error["code"] == "origin_not_allowed" and error["type"] == "permission_error"
    assert openai_error(post(client, "/slots/0?action=erase", None, origin=EVIL, body=b""),
                        403)["code"] == "origin_not_allowed"
    error = anthropic_error(post(client, "/v1/messages", "text/plain", origin=EVIL,
                                 body=MESSAGES_BODY), 403)
    assert error["type"] == "permission_error"
    for origin in ("null", "http://localhost.evil.example", "https://127.0.0.1.evil.example"):
        assert post(client, "/tokenize", "application/json", origin=origin).status_code == 403
    # reading is left to CORS (the answer is not shared with the page)
    models = client.get("/v1/models", headers={"Origin": EVIL})
    assert models.status_code != 403 and "access-control-allow-origin" not in models.headers
    # a preflight is still answered 200, as llama-server answers it
    preflight = client.options("/v1/chat/completions", headers={
        "Origin": EVIL, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 200
    assert "access-control-allow-origin" not in preflight.headers


def test_same_origin_and_allowed_origins_pass(make: Any) -> None:
    client = make(cors_origins=["http://ui.example"])
    for origin in (LOCAL, "https://127.0.0.1:8080", "http://ui.example"):
        assert passed(post(client, "/v1/chat/completions", "application/json", origin=origin))
    for origin in ("http://localhost:5173", "http://127.0.0.1:8081"):  # not allowed here
        assert post(client, "/v1/chat/completions", "application/json",
                    origin=origin).status_code == 403
    anyone = make(cors_origins=["*"])
    assert passed(post(anyone, "/v1/chat/completions", "application/json", origin=EVIL))
    assert post(anyone, "/v1/chat/completions", "text/plain", origin=EVIL).status_code == 415


def test_a_foreign_host_is_refused_on_every_route(make: Any) -> None:
    client = make()
    for path in ("/", "/dashboard", "/static/chat.js", "/health", "/v1/models", "/props",
                 "/slots", "/nothing-here"):
        error = openai_error(client.get(path, headers={"Host": "evil.example:8080"}), 403)
        assert error["code"] == "host_not_allowed", path
    error = openai_error(post(client, "/v1/chat/completions", "application/json",
                              origin="http://evil.example:8080", Host="evil.example:8080"), 403)
    assert error["code"] == "host_not_allowed"  # a rebinding page is same-origin
    assert anthropic_error(post(client, "/v1/messages", "application/json", body=MESSAGES_BODY,
                                Host="evil.example"), 403)["type"] == "permission_error"
    for host in ("localhost:8080", "LOCALHOST", "localhost.", "127.0.0.1:1", "[::1]:8080",
                 "192.168.1.20:8080", "[fe80::1]"):
        assert client.get("/", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_and_bound_names_are_answered(make: Any) -> None:
    client = make(allowed_hosts=["llm.example.com", ".corp.example"], bind_hosts=["gpu.lan"])
    for host in ("llm.example.com", "LLM.example.com:443", "corp.example", "a.b.corp.example",
                 "gpu.lan:8080"):
        assert client.get("/", headers={"Host": host}).status_code == 200, host
    for host in ("example.com", "evilcorp.example", "llm.example.com.evil", "gpu.lan.evil"):
        assert client.get("/", headers={"Host": host}).status_code == 403, host
    anyone = make(allowed_hosts=["*"])
    assert anyone.get("/", headers={"Host": "whatever.example"}).status_code == 200


def test_binding_every_interface_answers_any_host_unless_hosts_are_listed(make: Any) -> None:
    exposed = make(bind_hosts=["0.0.0.0", "::"])
    assert exposed.get("/", headers={"Host": "llamapy.default.svc:8080"}).status_code == 200
    listed = make(bind_hosts=["0.0.0.0"], allowed_hosts=["localhost"])
    for host in (socket.gethostname(), "10.0.0.7:8080", "localhost:8080"):
        assert listed.get("/", headers={"Host": host}).status_code == 200, host
    assert listed.get("/", headers={"Host": "evil.example"}).status_code == 403
    loopback = make(bind_hosts=["127.0.0.1", "::1"])
    assert loopback.get("/", headers={"Host": "llamapy.default.svc"}).status_code == 403


def test_the_refusal_has_the_routes_shape_under_an_api_prefix(make: Any) -> None:
    client = make(api_prefix="/llm")
    anthropic_error(post(client, "/llm/v1/messages", "text/plain", body=MESSAGES_BODY), 415)
    openai_error(post(client, "/llm/v1/chat/completions", "text/plain"), 415)


def test_every_response_says_nosniff_and_carries_the_csp(make: Any) -> None:
    client = make()
    for response in (client.get("/"), client.get("/dashboard"), client.get("/static/chat.js"),
                     client.get("/health"), post(client, "/tokenize", "text/plain")):
        assert response.headers["x-content-type-options"] == "nosniff"
        csp = response.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp


class _InlineFinder(HTMLParser):
    """Collects what a CSP without ``'unsafe-inline'`` blocks: inline scripts and styles,
    ``style`` and ``on*`` attributes, ``javascript:`` URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self.scripts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "style" or (tag == "script" and not named.get("src")):
            self.found.append(f"inline <{tag}>")
        if tag == "script" and named.get("src"):
            self.scripts.append(str(named["src"]))
        for name, value in attrs:
            if name == "style" or name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>")
            if (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}=javascript:...>")


def test_the_pages_have_no_inline_script_or_style() -> None:
    for page in ("index.html", "dashboard.html"):
        finder = _InlineFinder()
        finder.feed((STATIC_DIR / page).read_text())
        assert finder.found == [], page
        assert finder.scripts and all(s.startswith("static/") for s in finder.scripts), page
    for script in STATIC_DIR.glob("*.js"):  # ours; the vendored ones are pinned bytes
        text = script.read_text()
        for blocked in ("eval(", "new Function", 'setAttribute("style"', "style=", " onclick="):
            assert blocked not in text, (script.name, blocked)


def test_host_policy_and_origin_helpers() -> None:
    policy = HostPolicy()
    assert policy.allows("localhost:8080") and policy.allows("[::1]")
    assert not policy.allows("localhost.evil.example") and not policy.allows("127.0.0.1.nip.io")
    assert same_origin("http://127.0.0.1:8080", "127.0.0.1:8080")
    assert not same_origin("http://127.0.0.1:8081", "127.0.0.1:8080")
    assert not same_origin("null", "null") and not same_origin("http://a", "")
    assert is_json_type("application/problem+json; charset=utf-8")
    assert not is_json_type("text/json") and not is_json_type("application/jsonp")


def test_allowed_hosts_and_bind_hosts_flags() -> None:
    parser = build_parser()
    got = app_options(parser.parse_args(["--allowed-hosts", "a.example,b.example",
                                         "--allowed-hosts", "c", "--host", "0.0.0.0,::1"]))
    assert got["allowed_hosts"] == ("a.example", "b.example", "c")
    assert got["bind_hosts"] == ("0.0.0.0", "::1")
    defaults = app_options(parser.parse_args([]))
    assert (defaults["allowed_hosts"], defaults["bind_hosts"]) == ((), ("127.0.0.1",))


def test_the_issues_page_request_is_refused_on_the_live_server(live: LiveApp) -> None:
    """A page's ``text/plain`` POST (no preflight) and a rebinding page's request: refused,
    nothing generated; the same request from a command line is served."""
    with httpx.Client(base_url=live.url, timeout=120) as http:
        body = chat("hi", max_tokens=1)
        page = http.post("/v1/chat/completions", json=body,
                         headers={"Content-Type": "text/plain", "Origin": EVIL})
        assert page.status_code == 403 and "choices" not in page.json()
        rebound = http.post("/v1/chat/completions", json=body,
                            headers={"Host": f"evil.example:{live.port}",
                                     "Origin": f"http://evil.example:{live.port}"})
        assert rebound.status_code == 403
        assert http.post("/v1/chat/completions", json=body).json()["choices"]
