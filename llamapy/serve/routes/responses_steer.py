"""Steering on the Responses WebSocket: ``response.steer`` queues user input for the response
the socket is running.

A steer names the running response (``previous_response_id``) and brings user messages only
(a string, or ``message`` items of role ``user`` with ``input_text``/``input_image``/
``input_file`` content). It is answered at once: ``response.steer.accepted`` (with the id it
gets) or ``response.steer.failed`` (``invalid_input``, ``response_not_found``,
``response_already_completed`` for a finished response of the socket, ``too_many_pending_steers``
past :data:`MAX_STEERS`, ``steering_not_supported`` for a response bound to a conversation).
The running response is not interrupted: when it ends, its queued input (in submission order)
starts an automatic successor with its settings, continuing it (``previous_response_id``);
the successor's ``response.created`` commits the input. A response that ends waiting for the
client's tool results keeps the input queued instead and says so after it completed
(``response.steer.pending``, with the calls awaiting output as ``required_input``); the
client's next ``response.create`` continuing it gets the input before its own. Input that
cannot be committed (the response failed, the successor could not start) comes back in
``response.steer.failed``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...openai_api.bridge import api_id

__all__ = ["MAX_STEERS", "Queued", "Running", "Steering", "required_input", "steer_failed"]

#: Steering submissions one response may queue.
MAX_STEERS = 8
#: Responses whose steering input waits for the client's tool results, kept at most.
MAX_PARKED = 4
#: The keys a ``response.steer`` frame may have, and a steering message.
FRAME_KEYS = frozenset({"type", "input", "previous_response_id"})
MESSAGE_KEYS = frozenset({"type", "role", "content"})
PART_TYPES = frozenset({"input_text", "input_image", "input_file"})


@dataclass(frozen=True, slots=True)
class Queued:
    """One accepted steering submission."""

    id: str
    previous_response_id: str
    input: Any

    def items(self) -> list[Any]:
        """Its input as items."""
        return [{"role": "user", "content": self.input}] if isinstance(self.input, str) else list(
            self.input)

    def echo(self) -> dict[str, Any]:
        """The ``steer`` of its events."""
        return {"id": self.id, "previous_response_id": self.previous_response_id}


@dataclass(slots=True)
class Running:
    """The response a socket runs: its id, lane, request (a successor's settings) and the
    input steered into it."""

    id: str
    stream_id: str | None
    request: Mapping[str, Any]
    accepting: bool = True
    steers: list[Queued] = field(default_factory=list)


def steer_failed(steer: Mapping[str, Any], code: str, message: str,
                 stream_id: str | None = None) -> dict[str, Any]:
    """``response.steer.failed`` returning ``steer`` (the submission, its ``id`` once it has
    one)."""
    event = {"type": "response.steer.failed",
             "error": {"code": code, "type": "invalid_request_error", "message": message},
             "steer": dict(steer)}
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def _lane(event: dict[str, Any], stream_id: str | None) -> dict[str, Any]:
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def _invalid_message(item: object) -> bool:
    if not isinstance(item, Mapping) or not set(item) <= MESSAGE_KEYS:
        return True
    if item.get("type", "message") != "message" or item.get("role") != "user":
        return True
    content = item.get("content")
    if isinstance(content, str):
        return False
    return not isinstance(content, list) or not content or any(
        not isinstance(part, Mapping) or part.get("type") not in PART_TYPES for part in content)


def check_steer(frame: Mapping[str, Any]) -> str | None:
    """Why a ``response.steer`` frame is invalid (None: it is valid)."""
    if not set(frame) <= FRAME_KEYS:
        return "response.steer takes only type, previous_response_id and input"
    if not isinstance(frame.get("previous_response_id"), str) or not frame[
            "previous_response_id"]:
        return "previous_response_id must name the running response"
    value = frame.get("input")
    if isinstance(value, str):
        return None if value else "input must not be empty"
    if not isinstance(value, list) or not value or any(_invalid_message(i) for i in value):
        return ("input must be a string or user messages (input_text, input_image or "
                "input_file content)")
    return None


def required_input(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tool results ``response`` waits for (stubs: its function calls)."""
    return [{"type": "function_call_output", "call_id": item.get("call_id"),
             "name": item.get("name")}
            for item in response.get("output", ()) if isinstance(item, Mapping)
            and item.get("type") == "function_call"]


class Steering:
    """One socket's steering: the running response and the input parked for a client's
    continuation."""

    def __init__(self) -> None:
        self.running: Running | None = None
        self.parked: OrderedDict[str, list[Queued]] = OrderedDict()

    def steer(self, frame: Mapping[str, Any], finished: Callable[[str], bool]
              ) -> dict[str, Any]:
        """The answer to a ``response.steer`` frame (queued when accepted); ``finished``:
        whether an id is a finished response of the socket."""
        echo = {key: value for key, value in frame.items() if key != "type"}
        invalid = check_steer(frame)
        if invalid is not None:
            return steer_failed(echo, "invalid_input", invalid)
        target, running = str(frame["previous_response_id"]), self.running
        if running is None or running.id != target or not running.accepting:
            if finished(target) or (running is not None and running.id == target):
                return steer_failed(echo, "response_already_completed",
                                    f"response '{target}' has completed")
            return steer_failed(echo, "response_not_found",
                                f"response '{target}' is not running on this connection")
        if running.request.get("conversation") is not None:
            return steer_failed(echo, "steering_not_supported", "a response bound to a "
                                "conversation cannot be steered", running.stream_id)
        if len(running.steers) >= MAX_STEERS:
            return steer_failed(echo, "too_many_pending_steers", f"response '{target}' "
                                f"already has {MAX_STEERS} steering inputs queued",
                                running.stream_id)
        queued = Queued(api_id("steer"), target, frame["input"])
        running.steers.append(queued)
        return _lane({"type": "response.steer.accepted", "steer": queued.echo()},
                     running.stream_id)

    def start(self, response_id: str, stream_id: str | None, request: Mapping[str, Any]
              ) -> None:
        """A response started (its ``response.created`` is being sent)."""
        self.running = Running(response_id, stream_id, request)

    def stop(self) -> Running | None:
        """The running response ended (or failed): it takes no more input."""
        running, self.running = self.running, None
        if running is not None:
            running.accepting = False
        return running

    def park(self, response_id: str, steers: list[Queued]) -> None:
        """Keep ``steers`` for the client's continuation of ``response_id``."""
        self.parked[response_id] = steers
        while len(self.parked) > MAX_PARKED:
            self.parked.popitem(last=False)

    def with_parked(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[Queued]]:
        """``request`` with the input parked for the response it continues before its own,
        and that input's submissions (committed once the response starts)."""
        parked = self.parked.pop(str(request.get("previous_response_id")), [])
        if not parked:
            return request, []
        own = request.get("input", [])
        listed = [{"role": "user", "content": own}] if isinstance(own, str) else own
        steered = [item for queued in parked for item in queued.items()]
        return {**request, "input": [*steered, *listed] if isinstance(listed, list)
                else listed}, parked


def successor(request: Mapping[str, Any], response_id: str, steers: list[Queued]
              ) -> dict[str, Any]:
    """The automatic successor of ``response_id``: its request's settings, the steered input
    (in submission order), continuing it."""
    body = {key: value for key, value in request.items()
            if key not in ("input", "previous_response_id", "conversation")}
    return {**body, "previous_response_id": response_id,
            "input": [item for queued in steers for item in queued.items()]}


def steer_pending(queued: Queued, required: list[dict[str, Any]], stream_id: str | None
                  ) -> dict[str, Any]:
    """``response.steer.pending``: ``queued`` waits for the client's tool results."""
    return _lane({"type": "response.steer.pending", "reason": "waiting_for_required_input",
                  "required_input": required, "steer": queued.echo()}, stream_id)
