"""The Responses WebSocket: ``ws /v1/responses`` (and ``/responses``), as the official
client's ``responses.connect()`` and Codex use it.

**Handshake.** The browser guard refuses a foreign ``Host`` or a page's ``Origin`` that
``--cors-origins`` does not allow (:mod:`llamapy.serve.guard`: CORS does not cover
WebSockets), then the API key is checked (``Authorization: Bearer`` or ``x-api-key``): a
refusal is the HTTP error in the OpenAI shape (a denial response: 401, 403), or a close with
1008 where the server cannot send one.

**Frames** are JSON text, one event each:

- ``response.create``: a ``POST /v1/responses`` body (``stream`` implied; Codex's
  ``client_metadata`` is ignored), run as that streamed request is: the same events, each
  a text frame, with the frame's ``stream_id`` copied into each. ``generate: false``
  prepares the state without output: the prompt is prefilled into the KV cache and the
  response completes with no output, kept so that a later ``previous_response_id``
  continues from it. Responses run one at a time, in the order sent
  (frames sent meanwhile wait, at most :data:`MAX_PENDING`).
- ``response.steer`` queues user input for the running response, answered at once
  (``response.steer.accepted`` or ``.failed``); when that response ends, the input starts its
  automatic successor (:mod:`.responses_steer`).
- ``response.processed`` (a client's acknowledgement) gets no reply.
- Anything else (bad JSON, a frame that is no object, an unknown ``type``, a binary frame),
  and a request the server refuses, is answered ``{"type": "error", "status": <HTTP status>,
  "error": {"type", "code", "message", "param"}}``; the socket stays open.

A frame larger than the server's ``max_body_bytes`` closes the socket (1009). A socket that
closes cancels its running response: its engine request ends and its slot is freed.

**Continuing.** ``previous_response_id`` continues a stored response, or one of the socket's
own last responses, which it remembers whatever their ``store`` said
(:class:`~llamapy.openai_api.responses_socket.SocketMemory`: the last
:data:`~llamapy.openai_api.responses_socket.MEMORY_RESPONSES`, bounded in bytes), as Codex
continues with ``store: false`` and only the new items.

**Models.** With several models each ``response.create`` leases its ``model`` for its run, as
an HTTP request does (:meth:`~llamapy.serve.source.ModelSource.hold`); a sleeping model is
woken by each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import orjson
from starlette import websockets as starlette_websockets
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect

from ...errors import InvalidOptionError, InvalidRequestError, LlamapyError, QueueFullError
from ...openai_api import astream_response
from ...openai_api.responses_socket import SocketMemory, aprefill_response, continue_on_socket
from ...openai_api.responses_state import akept_events
from ..context import CANCEL_ATTEMPTS, DISCONNECT_POLL_S, AppContext
from ..errors import error_body, refuse_websocket
from ..routing import Router
from .responses_steer import (
    Queued,
    Running,
    Steering,
    required_input,
    steer_failed,
    steer_pending,
    successor,
)

__all__ = ["MAX_PENDING", "WS_MESSAGE_TOO_BIG", "responses_ws_router", "ws_error_event"]

log = logging.getLogger("llamapy.serve")

#: Frames a socket may send ahead of the response it waits for (more: an error event each).
MAX_PENDING = 16
#: The close code of a frame over the size limit (RFC 6455's "message too big").
WS_MESSAGE_TOO_BIG = 1009
#: A ``response.create`` frame's fields that are the socket's, not the request's
#: (``client_metadata``: Codex's tags for its own logs).
TRANSPORT_FIELDS = frozenset({"type", "stream_id", "generate", "stream", "client_metadata"})
#: The events that end a response.
FINAL_EVENTS = ("response.completed", "response.incomplete")
#: What a send raises once the socket is closed (Starlette >= 0.38 has the second).
GONE: tuple[type[Exception], ...] = (WebSocketDisconnect, getattr(
    starlette_websockets, "WebSocketDisconnected", WebSocketDisconnect))


def ws_error_event(exc: BaseException, stream_id: str | None = None) -> dict[str, Any]:
    """The WebSocket's ``error`` event for ``exc`` (its HTTP status and OpenAI error body)."""
    status, body = error_body(exc)
    event: dict[str, Any] = {"type": "error", "status": status, "error": body["error"]}
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def parse_frame(message: Message) -> dict[str, Any]:
    """A text frame's JSON object (else :class:`InvalidRequestError`, a 400)."""
    text = message.get("text")
    if text is None:
        raise InvalidRequestError("binary frames are not accepted: send JSON text frames")
    try:
        frame = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"malformed JSON frame: {exc}") from None
    if not isinstance(frame, dict):
        raise InvalidRequestError("a frame must be a JSON object with a 'type'")
    return frame


def frame_bytes(message: Message) -> int:
    """The size of a frame's payload."""
    text = message.get("text")
    return len(text.encode()) if text is not None else len(message.get("bytes") or b"")


def create_options(frame: dict[str, Any]) -> tuple[dict[str, Any], str | None, bool]:
    """A ``response.create`` frame's request body, ``stream_id`` and ``generate``."""
    body = {key: value for key, value in frame.items() if key not in TRANSPORT_FIELDS}
    stream_id, generate = frame.get("stream_id"), frame.get("generate")
    if stream_id is not None and not isinstance(stream_id, str):
        raise InvalidOptionError("stream_id must be a string", option="stream_id")
    if generate is not None and not isinstance(generate, bool):
        raise InvalidOptionError("generate must be a boolean", option="generate")
    if body.get("background") is True:
        raise InvalidOptionError("background responses are not run over the WebSocket: "
                                 "POST /v1/responses, then poll", option="background")
    return body, stream_id, generate is not False


def _stream_id(frame: dict[str, Any]) -> str | None:
    value = frame.get("stream_id")
    return value if isinstance(value, str) else None


async def _stop(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait for it, cancelling again while it runs (a cancellation that
    races with an engine event may be swallowed on Python < 3.12)."""
    for _ in range(CANCEL_ATTEMPTS):
        task.cancel()
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if task.done():
            break
    if task.done() and not task.cancelled() and task.exception() is not None:
        log.warning("the Responses WebSocket's worker failed: %r", task.exception())


class ResponsesSocket:
    """One accepted socket: frames are received as they come (so a close is noticed at once,
    and a steer reaches the running response) and answered in order by a worker task (see
    the module)."""

    def __init__(self, ctx: AppContext, websocket: WebSocket, max_frame_bytes: int) -> None:
        self.ctx = ctx
        self.websocket = websocket
        self.max_frame_bytes = max_frame_bytes
        self.memory = SocketMemory()
        self.steering = Steering()
        self.frames: asyncio.Queue[dict[str, Any] | LlamapyError] = asyncio.Queue(MAX_PENDING)
        self._sending = asyncio.Lock()
        self._sequence = 0

    async def serve(self) -> None:
        """Receive until the client closes (or sends an oversized frame); the running
        response is then cancelled."""
        worker = asyncio.ensure_future(self._work())
        try:
            await self._receive()
        except GONE:
            pass
        finally:
            await _stop(worker)

    async def _receive(self) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if frame_bytes(message) > self.max_frame_bytes:
                await self.websocket.close(WS_MESSAGE_TOO_BIG, "frame too large")
                return
            try:
                frame: dict[str, Any] | LlamapyError = parse_frame(message)
            except InvalidRequestError as exc:
                frame = exc
            if isinstance(frame, dict) and frame.get("type") == "response.steer":
                await self._send(self.steering.steer(frame, self.memory.__contains__))
                continue
            try:
                self.frames.put_nowait(frame)
            except asyncio.QueueFull:
                await self._send(ws_error_event(QueueFullError(MAX_PENDING)))

    async def _send(self, event: dict[str, Any]) -> None:
        """Send ``event``, numbered within its response (from its ``response.created``)."""
        async with self._sending:
            if event.get("type") == "response.created":
                self._sequence = 0
            event["sequence_number"] = self._sequence
            self._sequence += 1
            await self.websocket.send_text(json.dumps(event, ensure_ascii=False))

    async def _work(self) -> None:
        while True:
            frame = await self.frames.get()
            try:
                await self._answer(frame)
            except GONE:
                return

    async def _answer(self, frame: dict[str, Any] | LlamapyError) -> None:
        """Answer one frame; an error is the ``error`` event (a bug's too, logged)."""
        stream_id = None
        try:
            if isinstance(frame, LlamapyError):
                raise frame
            stream_id = _stream_id(frame)
            kind = frame.get("type")
            if kind == "response.create":
                await self._create(frame)
            elif kind != "response.processed":
                raise InvalidOptionError(
                    f"unknown event type {kind!r}: send response.create, response.steer or "
                    "response.processed", option="type")
        except GONE:
            raise
        except Exception as exc:
            if not isinstance(exc, LlamapyError):
                log.exception("the Responses WebSocket failed on a frame")
            await self._send(ws_error_event(exc, stream_id))

    async def _create(self, frame: dict[str, Any]) -> None:
        """Run a ``response.create`` (with the input steered into the response it continues),
        then the successors of the input steered into it."""
        request, stream_id, generate = create_options(frame)
        request, carried = self.steering.with_parked(request)
        while True:
            try:
                final, running = await self._run(request, stream_id, generate)
            except Exception:
                await self._abandon(self.steering.stop(), carried, stream_id)
                raise
            if final is None or running is None or not running.steers:
                return
            steers, required = running.steers, required_input(final)
            if required:  # waiting for the client's tool results: its continuation takes them
                self.steering.park(running.id, steers)
                for queued in steers:
                    await self._send(steer_pending(queued, required, stream_id))
                return
            request, carried, generate = successor(request, running.id, steers), steers, True

    async def _abandon(self, running: Running | None, carried: list[Queued],
                       stream_id: str | None) -> None:
        """Return the steered input a failed response (or successor) cannot commit."""
        lost, code = (running.steers, "response_not_active") if running is not None else (
            carried, "successor_creation_failed")
        for queued in lost:
            await self._send(steer_failed({**queued.echo(), "input": queued.input}, code,
                                          "the steered input could not be committed: send it "
                                          "with the next response.create", stream_id))

    async def _run(self, request: dict[str, Any], stream_id: str | None, generate: bool
                   ) -> tuple[dict[str, Any] | None, Running | None]:
        """Run one response, sending its events; its final response and what was steered
        into it."""
        model = request.get("model")
        final: dict[str, Any] | None = None
        running: Running | None = None
        async with self._model(model if isinstance(model, str) else None):
            events = await self._events(request, generate)
            async with aclosing(events):
                async for event in events:
                    kind = event.get("type")
                    if kind == "response.created":
                        self.steering.start(str(event["response"]["id"]), stream_id, request)
                    elif kind in FINAL_EVENTS:
                        final = event["response"]
                        running = self.steering.stop()
                    if stream_id is not None:
                        event["stream_id"] = stream_id
                    await self._send(event)
        return (final, running) if final is not None else (None, self.steering.stop())

    async def _events(self, request: dict[str, Any], generate: bool
                      ) -> AsyncGenerator[dict[str, Any], None]:
        """The response's events: continued (from the store or the socket's memory), echoed,
        kept (unless ``store: false``) and remembered by the socket."""
        ctx, store, websocket = self.ctx, self.ctx.response_store, self.websocket
        served = ctx.served(websocket)
        body, stored, previous = await asyncio.to_thread(
            continue_on_socket, store, self.memory, ctx.tenant(websocket), request)
        run = astream_response if generate else aprefill_response
        events = akept_events(run(served, body, observe=ctx.metrics.observe), store, stored)
        return self._remembered(events, body, previous)

    async def _remembered(self, events: AsyncGenerator[dict[str, Any], None], body: Any,
                          previous: str | None) -> AsyncGenerator[dict[str, Any], None]:
        async with aclosing(events):
            async for event in events:
                response = event.get("response")
                if isinstance(response, dict):
                    if previous is not None:  # continued from the socket's memory
                        response["previous_response_id"] = previous
                    if event.get("type") in FINAL_EVENTS:
                        self.memory.remember(body, response)
                yield event

    @contextlib.asynccontextmanager
    async def _model(self, requested: str | None) -> AsyncIterator[None]:
        """The model held for one response: several models' ``requested`` one leased, a
        sleeping one woken (what the HTTP middleware does for a request)."""
        async with self.ctx.source.hold(requested, self.ctx.principal(self.websocket)):
            yield


def responses_ws_router(ctx: AppContext, max_frame_bytes: int) -> Router:
    """``ws /v1/responses`` and ``ws /responses`` (frames up to ``max_frame_bytes``)."""
    router = Router()

    @router.websocket("/v1/responses")
    @router.websocket("/responses")
    async def responses_socket(websocket: WebSocket) -> None:
        """The Responses WebSocket (see the module)."""
        try:
            ctx.check_key(websocket)
        except LlamapyError as exc:
            await refuse_websocket(websocket, exc)
            return
        await websocket.accept()
        await ResponsesSocket(ctx, websocket, max_frame_bytes).serve()

    return router
