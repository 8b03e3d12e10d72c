"""A buffered HTTP request passed from the ingress to a model replica, and running it there.

The ingress reads the request (it needs the body to compute the routing key), packs it into a
:class:`ForwardedRequest` and calls a replica; the replica runs it through its own
:func:`~llamapy.serve.create_app` app in process with :func:`run_asgi`, which yields the app's
ASGI response messages as they come (a stream's chunks one by one). So every route of the app
(OpenAI, Anthropic, Responses, llama-server's) is served by the replicas unchanged. The
request's ``receive`` gives the body, then waits: when the caller stops reading (its client
left), the app sees ``http.disconnect`` and cancels the engine request. Nothing here imports
Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message

#: The response header naming the replica that served the request.
REPLICA_HEADER = "x-llamapy-replica"


@dataclass(frozen=True, slots=True)
class ForwardedRequest:
    """An HTTP request, body included: what the app needs to build its ASGI scope."""

    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    client: tuple[str, int] | None = None

    @classmethod
    def of(cls, request: Request, body: bytes) -> ForwardedRequest:
        """The forwarded form of a Starlette request whose body was read (its path without
        the application's route prefix, Serve's ``root_path``)."""
        client = (request.client.host, request.client.port) if request.client else None
        path, root = request.url.path, str(request.scope.get("root_path", ""))
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        return cls(method=request.method, path=path,
                   query_string=request.url.query.encode("latin-1"),
                   headers=tuple(request.headers.raw), body=body, client=client)

    def scope(self) -> dict[str, Any]:
        """The ASGI HTTP scope of the request."""
        return {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": self.method, "scheme": "http",
            "path": self.path, "raw_path": self.path.encode("utf-8"), "root_path": "",
            "query_string": self.query_string, "headers": [list(h) for h in self.headers],
            "client": self.client, "server": ("127.0.0.1", 0), "state": {},
        }


async def run_asgi(app: ASGIApp, request: ForwardedRequest,
                   extra_headers: tuple[tuple[bytes, bytes], ...] = ()
                   ) -> AsyncIterator[Message]:
    """Run ``request`` through ``app``; yield its ``http.response.start`` (with
    ``extra_headers`` added) and ``http.response.body`` messages until the last body part.
    Closing the iterator early disconnects the request and cancels the app."""
    messages: asyncio.Queue[Message | None] = asyncio.Queue()
    finished = asyncio.Event()
    task = asyncio.ensure_future(app(request.scope(), _receiver(request.body, finished),
                                     messages.put))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()),
                                                  *extra_headers]}
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body"):
                return
        task.result()  # the app ended without a response: raise its error
    finally:
        finished.set()
        await _stop(task)


def _receiver(body: bytes, finished: asyncio.Event) -> Any:
    """The app's ``receive``: the whole body, then ``http.disconnect`` once ``finished``."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    return receive


async def _stop(task: asyncio.Future[Any]) -> None:
    """Let the app finish after its last message (briefly), else cancel it."""
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
        await asyncio.wait_for(asyncio.shield(task), timeout=5.0)
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
