"""The Responses WebSocket's state: what one socket remembers, and responses that prepare
state without output.

A client on the WebSocket (the official client's ``responses.connect()``, Codex) continues
its last response with ``previous_response_id`` and only the new input items, whatever its
``store`` said: :class:`SocketMemory` keeps the whole conversation of the socket's last few
responses (bounded in count and bytes), consulted when the store does not have the response
(``store: false``, or the store off), so the continuation renders exactly as if the client
had resent the conversation, and runs as a stored chain's turn does (under its first
response's id as ``prompt_cache_key``, unless the request says otherwise).
:func:`continue_on_socket` is :func:`~.responses_state.continue_request` with that memory;
:func:`aprefill_response` runs a response with ``generate: false``: its prompt is prefilled
into the KV cache and the response completes with no output, ready to be continued.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from dataclasses import replace
from typing import Any

import orjson

from .bridge import Observer, aplan_events
from .chat import Target, aready
from .response_ids import chain_tag, response_id
from .response_store import ResponseStore
from .responses import ResponseStream
from .responses_input import ResponsesPlan, prepare_responses
from .responses_state import (
    Stored,
    continue_request,
    kept_items,
    normalize_items,
    with_history,
)

__all__ = ["MEMORY_BYTES", "MEMORY_RESPONSES", "SocketMemory", "aprefill_response",
           "continue_on_socket"]

#: How many of its last responses a socket remembers.
MEMORY_RESPONSES = 4
#: How many bytes (as JSON) of conversation a socket remembers at most.
MEMORY_BYTES = 64 * 1024 * 1024


class SocketMemory:
    """The conversations (input items then output) of one socket's last responses, by
    response id: at most ``max_responses`` of them and ``max_bytes`` of JSON, the least
    recently used dropped first (one bigger than ``max_bytes`` is not kept)."""

    def __init__(self, max_responses: int = MEMORY_RESPONSES,
                 max_bytes: int = MEMORY_BYTES) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, tuple[list[dict[str, Any]], int, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._kept

    @property
    def bytes(self) -> int:
        """The JSON size of what is kept."""
        return sum(size for _, size, _ in self._kept.values())

    def get(self, response_id: object) -> list[dict[str, Any]] | None:
        """The conversation through ``response_id`` (None: not remembered)."""
        if not isinstance(response_id, str) or response_id not in self._kept:
            return None
        self._kept.move_to_end(response_id)
        return list(self._kept[response_id][0])

    def root(self, response_id: str) -> str:
        """The ``prompt_cache_key`` of the chain ``response_id`` ends (itself when unknown)."""
        kept = self._kept.get(response_id)
        return response_id if kept is None else kept[2]

    def put(self, response_id: str, items: list[dict[str, Any]], root: str | None = None
            ) -> None:
        """Remember the conversation through ``response_id``, whose chain runs under the
        ``prompt_cache_key`` ``root`` (None: its own id, a first turn's)."""
        self._kept.pop(response_id, None)
        try:
            size = len(orjson.dumps(items))
        except orjson.JSONEncodeError:  # nested past orjson's bound: not remembered
            return
        if size > self.max_bytes:
            return
        self._kept[response_id] = (items, size, root or response_id)
        while len(self._kept) > self.max_responses or self.bytes > self.max_bytes:
            self._kept.popitem(last=False)

    def remember(self, request: Any, response: Mapping[str, Any]) -> None:
        """Remember a finished ``response`` of the prepared ``request`` (its whole input; the
        key it ran under is its chain's)."""
        if response.get("status") not in ("completed", "incomplete"):
            return
        request = request if isinstance(request, Mapping) else {}
        output = [dict(item) for item in response.get("output", ()) if isinstance(item, dict)]
        key = request.get("prompt_cache_key")
        self.put(str(response["id"]), [*normalize_items(request.get("input")), *output],
                 key if isinstance(key, str) else None)


def _remembered(store: ResponseStore | None, memory: SocketMemory, tenant: str,
                request: Any) -> list[dict[str, Any]] | None:
    """The socket's own conversation that ``request`` continues, when the store has none."""
    if not isinstance(request, Mapping) or request.get("conversation") is not None:
        return None
    previous = request.get("previous_response_id")
    history = memory.get(previous)
    if history is None:
        return None
    if store is not None and store.get_response(tenant, previous) is not None:
        return None  # stored: continued from the store, its chain kept as a chain
    return history


def continue_on_socket(store: ResponseStore | None, memory: SocketMemory, tenant: str,
                       request: Any) -> tuple[Any, Stored, str | None]:
    """:func:`~.responses_state.continue_request`, where a ``previous_response_id`` the
    store does not have is looked up in ``memory``. Also returns that id when it came from
    ``memory`` (the response then echoes it; stored, it holds the whole conversation as its
    own input, having no stored response to link to)."""
    history = _remembered(store, memory, tenant, request)
    if history is None:
        body, stored = continue_request(store, tenant, request)
        return body, stored, None
    previous = str(request["previous_response_id"])
    body = with_history(request, history)
    body.setdefault("prompt_cache_key", memory.root(previous))  # as a stored chain's turns
    keep, items = kept_items(request, body["input"])
    return body, Stored(tenant, None, None, keep, items,
                        response_id=response_id(chain_tag(previous))), previous


def _prefill_only(plan: ResponsesPlan) -> ResponsesPlan:
    chat = plan.chat
    intent = chat.served.server.revise(chat.intent, max_tokens=0)
    return replace(plan, chat=replace(chat, intent=intent))


async def aprefill_response(target: Target, request: Mapping[str, Any], *,
                            observe: Observer | None = None
                            ) -> AsyncGenerator[dict[str, Any], None]:
    """The stream events of ``request`` run without output (``generate: false``): the prompt
    is prefilled (so its KV is cached) and the response is ``completed`` with no output."""
    plan = _prefill_only(await asyncio.to_thread(prepare_responses, await aready(target),
                                                 request))
    events = aplan_events(plan.chat, ResponseStream(plan).on_event, observe)
    async with aclosing(events):
        async for event in events:
            if event.get("type") == "response.incomplete":
                event["type"] = "response.completed"
                event["response"].update(status="completed", incomplete_details=None)
            yield event
