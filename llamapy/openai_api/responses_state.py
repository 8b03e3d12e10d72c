"""Responses that continue stored state: ``previous_response_id``, ``conversation``,
``store``.

:func:`continue_request` turns a request that names a stored response or conversation into
the request a client resending the whole conversation would make (the stored items, then its
own ``input``), so it renders to the same tokens and reuses the same cached KV (a continued
turn computes only its new items). A chain's turns share a ``prompt_cache_key`` (its first
response's id, unless the request gives one: the slot affinity that keeps it on the slot
holding its KV; when another conversation takes that slot meanwhile, the prefix goes to the
RAM cache as any does). :func:`record` keeps the finished
response (its own input, its output, the link to what it continued) unless the request said
``store: false``, and appends both to its conversation. :func:`echo` puts the three fields
into the response objects the client sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidOptionError, StoredObjectNotFoundError
from .bridge import api_id
from .response_ids import conversation_tag, response_id
from .response_store import ResponseStore, storable

__all__ = ["Stored", "akept_events", "akept_response", "continue_request", "echo",
           "kept_items", "normalize_items", "record", "with_history"]


@dataclass(frozen=True, slots=True)
class Stored:
    """What one Responses request continues and whether it is kept."""

    tenant: str
    previous_response_id: str | None = None
    conversation: str | None = None
    store: bool = False
    own_input: tuple[dict[str, Any], ...] = ()
    #: The id the response gets (its conversation's tag first: :mod:`.response_ids`).
    response_id: str | None = None


_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "reasoning": "rs", "compaction": "cmp"}
_WITH_STATUS = ("message", "function_call", "function_call_output")


def _message_content(role: str, content: object) -> object:
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        return [{"type": kind, "text": content}]
    return content


def normalize_item(raw: dict[str, Any]) -> dict[str, Any]:
    """An input item as stored and listed: a ``type``, an ``id``, list content, a status."""
    item = dict(raw)
    kind = item.setdefault("type", "message" if "role" in item else "item")
    if kind == "message":
        item["content"] = _message_content(str(item.get("role")), item.get("content"))
    if not isinstance(item.get("id"), str) or not item["id"]:
        item["id"] = api_id(_ID_PREFIX.get(str(kind), "item"))
    if kind in _WITH_STATUS:
        item.setdefault("status", "completed")
    return item


def normalize_items(value: object) -> list[dict[str, Any]]:
    """``input`` (a string or items) as stored items (anything else: none; the request's
    own validation refuses it)."""
    if isinstance(value, str):
        return [normalize_item({"role": "user", "content": value})]
    if isinstance(value, list):
        return [normalize_item(item) for item in value if isinstance(item, dict)]
    return []


def _conversation_id(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("id"), str):
        return str(value["id"])
    raise InvalidOptionError("conversation must be an id or an object with an 'id'",
                             option="conversation")


def _history(store: ResponseStore, tenant: str, previous: object, conversation: str | None
             ) -> list[dict[str, Any]]:
    if previous is not None and conversation is not None:
        raise InvalidOptionError("give previous_response_id or conversation, not both",
                                 option="previous_response_id")
    if previous is not None:
        items = store.history(tenant, previous)
        if items is None:
            raise StoredObjectNotFoundError(f"previous response with id '{previous}' not found",
                                            option="previous_response_id",
                                            code="previous_response_not_found")
        _check_ended(store, tenant, previous)
        return items
    if conversation is not None:
        found = store.items(tenant, conversation)
        if found is None:
            raise StoredObjectNotFoundError(f"conversation with id '{conversation}' not found",
                                            option="conversation")
        return found
    return []


def _check_ended(store: ResponseStore, tenant: str, previous: object) -> None:
    """A background response that has not ended cannot be continued (a 400)."""
    found = store.get_response(tenant, previous)
    status = found.get("status") if found else None
    if status not in ("completed", "incomplete", None):
        raise InvalidOptionError(f"previous response '{previous}' is {status}: only a completed "
                                 "or incomplete response can be continued",
                                 option="previous_response_id")


def continue_request(store: ResponseStore | None, tenant: str, request: Any
                     ) -> tuple[Any, Stored]:
    """The request to prepare (stored items, then the request's own ``input``; without
    ``previous_response_id``, ``conversation`` and ``store``) and what it continues. With
    no store, the request as it is (its stateful fields are then refused as unsupported)."""
    if store is None or not isinstance(request, Mapping):
        return request, Stored(tenant)
    previous = request.get("previous_response_id")
    conversation = _conversation_id(request.get("conversation"))
    history = _history(store, tenant, previous, conversation)
    body = with_history(request, history)
    if isinstance(previous, str):  # a chain: keep it on its slot
        body.setdefault("prompt_cache_key", store.root(tenant, previous))
    keep, own_items = kept_items(request, request.get("input", []))
    return body, Stored(tenant, previous if isinstance(previous, str) else None, conversation,
                        keep, own_items, response_id(conversation_tag(request)))


def with_history(request: Mapping[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """``request`` with ``history`` before its own ``input`` (a string: one user message),
    without ``previous_response_id``, ``conversation`` and ``store``."""
    own = request.get("input", [])
    body = {k: v for k, v in request.items()
            if k not in ("previous_response_id", "conversation", "store")}
    if history:
        listed = [{"role": "user", "content": own}] if isinstance(own, str) else own
        body["input"] = [*history, *listed] if isinstance(listed, list) else listed
    return body


def kept_items(request: Mapping[str, Any], items: object
               ) -> tuple[bool, tuple[dict[str, Any], ...]]:
    """Whether ``request`` is stored (``store`` not false) and ``items`` as stored, refused
    now (a 400) when they cannot be, not after the response was computed."""
    keep, normalized = request.get("store", True) is not False, normalize_items(items)
    if keep:
        storable(normalized)
    return keep, tuple(normalized)


def echo(stored: Stored, response: dict[str, Any]) -> dict[str, Any]:
    """``response`` with the request's ``previous_response_id``, ``conversation`` and
    ``store``, and its conversation's id (in place; returned for chaining)."""
    if stored.response_id is not None:
        response["id"] = stored.response_id
    response["previous_response_id"] = stored.previous_response_id
    response["conversation"] = ({"id": stored.conversation} if stored.conversation
                                else None)
    response["store"] = stored.store
    return response


def record(store: ResponseStore | None, stored: Stored, response: dict[str, Any]) -> None:
    """Keep a finished ``response`` (see the module docstring)."""
    if store is None or not stored.store:
        return
    if response.get("status") not in ("completed", "incomplete"):
        return
    store.put_response(stored.tenant, response, stored.own_input, stored.previous_response_id)
    if stored.conversation is not None:
        store.add_items(stored.tenant, stored.conversation,
                        [*stored.own_input, *response.get("output", ())])


async def akept_response(work: Awaitable[dict[str, Any]], store: ResponseStore | None,
                         stored: Stored) -> dict[str, Any]:
    """The response ``work`` makes, echoed and recorded (before the client has it, so a
    continuation it sends at once finds it)."""
    response = echo(stored, await work)
    await asyncio.to_thread(record, store, stored, response)
    return response


async def akept_events(events: AsyncGenerator[dict[str, Any], None],
                       store: ResponseStore | None, stored: Stored
                       ) -> AsyncGenerator[dict[str, Any], None]:
    """Stream ``events`` with each response object echoed; the final one is recorded before
    it is sent."""
    async with aclosing(events):
        async for event in events:
            response = event.get("response")
            if isinstance(response, dict):
                echo(stored, response)
                if event.get("type") in ("response.completed", "response.incomplete"):
                    await asyncio.to_thread(record, store, stored, response)
            yield event
