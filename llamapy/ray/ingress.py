"""``LlamapyIngress``: the HTTP deployment in front of the model replicas.

Why a deployment of its own: Ray's HTTP proxy hands an ingress deployment only the request's
ASGI scope, and the replica pulls the body afterwards, so a router for an HTTP deployment sees
headers but no body (no messages, no ``cache_scope``). The ingress authenticates the request
from its headers first (:meth:`LlamapyIngress.caller`): with the deployment's keys, a request
that may carry a body (any method but ``GET``, ``HEAD`` and ``OPTIONS``, or a declared body)
without one of them is a 401 in the API's error shape, its body never read; a bodiless ``GET``
without a key is relayed routed by load (the replica serves ``/health`` and the pages, and
answers the 401 elsewhere). Then it reads the body (bounded by the app's body limit), computes
the :class:`~llamapy.ray.keys.RoutingKey` (scoped by the tenant of the caller's API key,
:mod:`llamapy.ray.tenancy`) and calls the model
deployment through a ``DeploymentHandle`` with the key as the ``routing`` keyword, which the
:class:`~llamapy.ray.router.AffinityRouter` reads. The replica's response streams back
unchanged (status, headers, each chunk).

A replica that dies or becomes unreachable fails its requests fast with
:class:`~llamapy.errors.ReplicaUnavailableError`: a 503 in the API's error shape (Anthropic's
on ``/v1/messages``, OpenAI's elsewhere) before the response started; after a stream started,
its last event is that error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import orjson
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from ..errors import (
    AuthenticationError,
    LlamapyError,
    PayloadTooLargeError,
    ReplicaUnavailableError,
)
from ..options.serve import ServeOptions
from ..serve.anthropic_errors import anthropic_error_body, anthropic_error_response
from ..serve.errors import error_body, error_response
from ..serve.ollama_errors import ollama_error_response
from .forward import ForwardedRequest
from .keys import BLOCK_CHARS, MAX_BLOCKS, RoutingKey, routing_key
from .router import ROUTING_KWARG
from .tenancy import TenantOf

log = logging.getLogger("llamapy.ray")

#: The request body limit's default (the option tree's).
MAX_BODY_BYTES = ServeOptions().max_body_bytes

#: Methods whose request is relayed without a key when it declares no body (the replica's
#: ``/health`` and pages are open; its other routes answer the 401).
BODILESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: What Ray raises for the requests of a replica that died or cannot be reached.
REPLICA_ERRORS: tuple[type[BaseException], ...] = (RayActorError, ActorUnavailableError)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: ``known`` when it offered a key of the deployment (then ``tenant``
    is the key's; None: the default tenant)."""

    known: bool
    tenant: str | None = None


class LlamapyIngress:
    """Reads each request, keys it and relays it to a model replica (see the module);
    ``tenant_of`` tells the tenant of a request's API key (None: every request is the default
    tenant's)."""

    def __init__(self, model: DeploymentHandle, *, max_body_bytes: int = MAX_BODY_BYTES,
                 block_chars: int = BLOCK_CHARS, max_blocks: int = MAX_BLOCKS,
                 tenant_of: TenantOf | None = None) -> None:
        self._model = model.options(method_name="forward", stream=True)
        self._max_body_bytes = max_body_bytes
        self._blocks = {"block_chars": block_chars, "max_blocks": max_blocks}
        self._tenant_of = tenant_of

    def caller(self, method: str, headers: Mapping[str, str]) -> Caller:
        """Who sends a request with these (lower-case) ``headers``, from the headers alone:
        :class:`AuthenticationError` for a request without a key of the deployment that may
        carry a body (see the module), an anonymous :class:`Caller` for a bodiless ``GET``
        without one (and for every request of a deployment without keys)."""
        if self._tenant_of is None:
            return Caller(known=False)
        try:
            return Caller(known=True, tenant=self._tenant_of(headers))
        except AuthenticationError:
            if method.upper() not in BODILESS_METHODS or _declares_body(headers):
                raise
            return Caller(known=False)

    def routing_key(self, caller: Caller, headers: Mapping[str, str], body: bytes,
                    path: str = "") -> RoutingKey:
        """The request's routing key, seeded with its caller's tenant; an empty key (routed by
        load, recorded nowhere) for an anonymous caller of a deployment with keys."""
        if self._tenant_of is not None and not caller.known:
            return RoutingKey()
        return routing_key(headers, _json(body), tenant=caller.tenant, path=path,
                           **self._blocks)

    async def __call__(self, request: Request) -> Response:
        """Relay one HTTP request (any method, any path) to a model replica: authenticated
        from its headers before its body is read."""
        try:
            caller = self.caller(request.method, request.headers)
            body = await _read_body(request, self._max_body_bytes)
        except LlamapyError as exc:
            return _error_response(request.url.path, exc)
        forwarded = ForwardedRequest.of(request, body)
        path = forwarded.path
        key = self.routing_key(caller, request.headers, body, path)
        stream = cast(DeploymentResponseGenerator[Message],
                      self._model.remote(forwarded, **{ROUTING_KWARG: key}))
        try:
            start = await stream.__anext__()
        except REPLICA_ERRORS as exc:
            return _error_response(path, _unavailable(exc))
        except asyncio.CancelledError:
            stream.cancel()
            raise
        return RelayedResponse(start, stream, path)


class RelayedResponse(Response):
    """A replica's response: its start message, then its body messages as they arrive."""

    def __init__(self, start: Message, rest: DeploymentResponseGenerator, path: str) -> None:
        self.status_code = int(start["status"])
        self.raw_headers = [(bytes(k), bytes(v)) for k, v in start.get("headers", ())]
        self.background = None
        self._start, self._rest, self._path = start, rest, path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(self._start)
        try:
            async for message in _bodies(self._rest):
                await send(message)
                if not message.get("more_body"):
                    return
        except REPLICA_ERRORS as exc:
            await send({"type": "http.response.body", "more_body": False,
                        "body": _stream_error(self._path, _unavailable(exc))})
            return
        except asyncio.CancelledError:
            self._rest.cancel()
            raise
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _bodies(stream: DeploymentResponseGenerator) -> AsyncIterator[Message]:
    async for message in stream:
        if message.get("type") == "http.response.body":
            yield message


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body; :class:`PayloadTooLargeError` past ``limit`` bytes."""
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(limit)
        parts.append(chunk)
    return b"".join(parts)


def _declares_body(headers: Mapping[str, str]) -> bool:
    """Whether the headers announce a body (a non-zero ``Content-Length`` or a
    ``Transfer-Encoding``)."""
    length = headers.get("content-length", "").strip()
    return "transfer-encoding" in headers or (bool(length) and length != "0")


def _json(body: bytes) -> Any:
    """The body as JSON, or None (the replica answers the 400 for a malformed one)."""
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None


def _unavailable(exc: BaseException) -> ReplicaUnavailableError:
    log.warning("replica failed during a request: %s", type(exc).__name__)
    replica = getattr(exc, "actor_id", None)
    return ReplicaUnavailableError(
        f"the replica serving this request is unavailable ({type(exc).__name__}); retry",
        replica=None if replica is None else str(replica))


def _anthropic(path: str) -> bool:
    return path.rstrip("/").startswith("/v1/messages")


def _error_response(path: str, exc: LlamapyError) -> JSONResponse:
    """The error in the API's shape for ``path`` (Anthropic's, Ollama's under ``/api/``, else
    OpenAI's)."""
    if path.startswith("/api/"):
        return ollama_error_response(exc)
    return anthropic_error_response(exc) if _anthropic(path) else error_response(exc)


def _stream_error(path: str, exc: LlamapyError) -> bytes:
    """The last SSE event of a stream whose replica failed."""
    if _anthropic(path):
        return b"event: error\ndata: " + orjson.dumps(anthropic_error_body(exc)[1]) + b"\n\n"
    return b"data: " + orjson.dumps(error_body(exc)[1]) + b"\n\n"
