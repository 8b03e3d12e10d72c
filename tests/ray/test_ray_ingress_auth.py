"""The Ray ingress authenticates from the headers before it reads a body: a request without a
key of the deployment that may carry a body is a 401 in the API's shape, its body never read
and no replica called; without a cluster (the ingress is called with a fake handle)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from starlette.requests import Request
from test_ray_tenants import FakeHandle as Handle

from llamapy.ray.ingress import LlamapyIngress
from llamapy.ray.keys import RoutingKey, routing_key
from llamapy.ray.tenancy import tenant_lookup
from llamapy.serve.tenants import KeyTable

#: A body far past any limit: only its headers are ever looked at.
HUGE = 10 ** 12
BODY = b'{"messages": [{"role": "user", "content": "hi"}], "cache_scope": "s"}'


class Body:
    """A request body, counting the times it is read (``chunks`` None: reading it fails the
    test)."""

    def __init__(self, chunks: list[bytes] | None) -> None:
        self.chunks = chunks
        self.reads = 0

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.chunks is None:
            raise AssertionError("the ingress read the body of an unauthenticated request")
        chunk = self.chunks.pop(0) if self.chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}


def call(ingress: LlamapyIngress, method: str, path: str, headers: dict[str, str],
         body: Body) -> tuple[int, bytes]:
    """Status and body of the ingress's answer to one request."""
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "scheme": "http",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def run() -> None:
        response = await ingress(Request(scope, body.receive))
        await response(scope, body.receive, send)

    anyio.run(run)
    return int(sent[0]["status"]), b"".join(m.get("body", b"") for m in sent[1:])


KEYS = KeyTable.parse("key-a acme\nkey-root - admin\n")


@pytest.fixture
def handle() -> Handle:
    return Handle()


@pytest.fixture
def ingress(handle: Handle) -> LlamapyIngress:
    return LlamapyIngress(handle, tenant_of=tenant_lookup({"api_keys": KEYS}),  # type: ignore[arg-type]
                          max_body_bytes=1024)


@pytest.mark.parametrize(("path", "headers", "shape"), [
    ("/v1/chat/completions", {}, b'"type":"authentication_error"'),
    ("/v1/chat/completions", {"authorization": "Bearer nope"}, b'"authentication_error"'),
    ("/v1/messages", {"x-api-key": "nope"}, b'"type":"error"'),
    ("/api/chat", {"authorization": "Basic key-a"}, b'{"error":'),
])
def test_a_huge_body_without_a_key_is_refused_unread(ingress: LlamapyIngress, handle: Handle,
                                                     path: str, headers: dict[str, str],
                                                     shape: bytes) -> None:
    body = Body(None)
    status, text = call(ingress, "POST", path, {**headers, "content-length": str(HUGE),
                                                "content-type": "application/json"}, body)
    assert (status, body.reads, handle.keys) == (401, 0, [])
    assert shape in text.replace(b" ", b""), text


def test_a_chunked_body_or_a_bodied_get_without_a_key_is_refused_too(
        ingress: LlamapyIngress, handle: Handle) -> None:
    for method, headers in (("POST", {"transfer-encoding": "chunked"}), ("PUT", {}),
                            ("DELETE", {}), ("GET", {"content-length": str(HUGE)})):
        body = Body(None)
        status, _ = call(ingress, method, "/slots/0", headers, body)
        assert (status, body.reads) == (401, 0), method
    assert handle.keys == []


def test_a_bodiless_get_without_a_key_is_relayed_by_load(ingress: LlamapyIngress,
                                                        handle: Handle) -> None:
    """``/health`` and the pages are open on the replicas: the ingress does not refuse them."""
    status, _ = call(ingress, "GET", "/health", {}, Body([]))
    assert status == 200 and handle.keys == [RoutingKey()]


def test_a_key_of_the_deployment_is_read_and_routed_in_its_tenant(
        ingress: LlamapyIngress, handle: Handle) -> None:
    for key, tenant in (("key-a", "acme"), ("key-root", None)):
        body = Body([BODY[:10], BODY[10:]])
        status, _ = call(ingress, "POST", "/v1/chat/completions",
                         {"authorization": f"Bearer {key}",
                          "content-length": str(len(BODY))}, body)
        assert status == 200 and body.reads >= 2
        assert handle.keys[-1] == routing_key({}, json.loads(BODY), tenant=tenant)


def test_the_body_limit_applies_after_the_key(ingress: LlamapyIngress, handle: Handle) -> None:
    status, text = call(ingress, "POST", "/v1/chat/completions",
                        {"x-api-key": "key-a"}, Body([b"x" * 2048]))
    assert status == 413 and handle.keys == [], text


def test_plain_keys_authenticate_at_the_ingress_too(handle: Handle) -> None:
    ingress = LlamapyIngress(handle, tenant_of=tenant_lookup({"api_key": "k1, k2"}))  # type: ignore[arg-type]
    assert call(ingress, "POST", "/completion", {"content-length": "5"},
                Body(None))[0] == 401
    assert call(ingress, "POST", "/completion", {"authorization": "Bearer k2"},
                Body([b'{"prompt": "x"}']))[0] == 200
    assert handle.keys[-1] == routing_key({}, {"prompt": "x"})


def test_a_deployment_without_keys_reads_every_request(handle: Handle) -> None:
    ingress = LlamapyIngress(handle, tenant_of=tenant_lookup({}))  # type: ignore[arg-type]
    body = Body([BODY])
    assert call(ingress, "POST", "/v1/chat/completions", {}, body)[0] == 200
    assert body.reads >= 1 and handle.keys == [routing_key({}, json.loads(BODY))]
