"""Stored responses and conversations as OpenAI's API shows them.

The functions behind ``GET``/``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items`` and ``/v1/conversations`` (create, retrieve, update,
delete; items: create, list, retrieve, delete), each on one tenant's view of a
:class:`~.response_store.ResponseStore`. Bodies and query values are checked here (a bad one
is an :class:`~llamapy.errors.InvalidOptionError`, 400); an id this tenant cannot see is a
:class:`~llamapy.errors.StoredObjectNotFoundError` (404), another tenant's included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidOptionError, StoredObjectNotFoundError
from .bridge import api_id
from .response_store import ResponseStore, storable
from .responses_params import parse_item
from .responses_state import normalize_items

__all__ = ["conversation_object", "create_conversation", "create_items", "delete_conversation",
           "delete_item", "delete_response", "get_conversation", "get_item", "get_response",
           "list_input_items", "list_items", "page", "update_conversation"]

#: Most items one call may add to a conversation (OpenAI's bound).
MAX_ITEMS = 20
#: Metadata bounds (OpenAI's): pairs, key and value lengths.
MAX_PAIRS, MAX_KEY, MAX_VALUE = 16, 64, 512


def page(items: Sequence[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of ``items`` (oldest first) as a list object: ``order`` (``desc``, the
    default, or ``asc``), ``limit`` (1-100, default 20), ``after`` (an item id)."""
    order, after = query.get("order", "desc"), query.get("after")
    if order not in ("asc", "desc"):
        raise InvalidOptionError("order must be 'asc' or 'desc'", option="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        raise InvalidOptionError("limit must be an integer", option="limit") from None
    if not 1 <= limit <= 100:
        raise InvalidOptionError("limit must be between 1 and 100", option="limit")
    ordered = list(items) if order == "asc" else list(items)[::-1]
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise InvalidOptionError(f"no item with id {after!r}", option="after")
        ordered = ordered[ids.index(after) + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit}


def _not_found(what: str, value: object, option: str) -> StoredObjectNotFoundError:
    return StoredObjectNotFoundError(f"{what} with id '{value}' not found", option=option)


def get_response(store: ResponseStore, tenant: str, response_id: str) -> dict[str, Any]:
    """A stored response."""
    found = store.get_response(tenant, response_id)
    if found is None:
        raise _not_found("response", response_id, "response_id")
    return found


def delete_response(store: ResponseStore, tenant: str, response_id: str) -> dict[str, Any]:
    """Delete a stored response: OpenAI's deletion object."""
    if not store.delete_response(tenant, response_id):
        raise _not_found("response", response_id, "response_id")
    return {"id": response_id, "object": "response", "deleted": True}


def list_input_items(store: ResponseStore, tenant: str, response_id: str,
                     query: Mapping[str, str]) -> dict[str, Any]:
    """A page of the input items a stored response was created with."""
    items = store.input_items(tenant, response_id)
    if items is None:
        raise _not_found("response", response_id, "response_id")
    return page(items, query)


# --- conversations ------------------------------------------------------------------------------


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > MAX_PAIRS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_KEY
            and len(v) <= MAX_VALUE for k, v in value.items()):
        raise InvalidOptionError(f"metadata must be an object of at most {MAX_PAIRS} strings "
                                 f"(keys up to {MAX_KEY} characters, values up to {MAX_VALUE})",
                                 option="metadata")
    return dict(value)


def _items(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise InvalidOptionError(f"items must be a list of at most {MAX_ITEMS} items",
                                 option="items")
    for i, raw in enumerate(value):
        parse_item(raw, f"items[{i}]")
    items = normalize_items(value)
    storable(items, "items")
    return items


def _body(body: object) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise InvalidOptionError("the body must be a JSON object")
    return body


def conversation_object(conversation_id: str, created_at: float,
                        metadata: Mapping[str, str]) -> dict[str, Any]:
    """A conversation as OpenAI shows it."""
    return {"id": conversation_id, "object": "conversation", "created_at": int(created_at),
            "metadata": dict(metadata)}


def create_conversation(store: ResponseStore, tenant: str, body: object) -> dict[str, Any]:
    """A new conversation from ``{"items", "metadata"}``."""
    fields = _body(body)
    metadata, items = _metadata(fields.get("metadata")), _items(fields.get("items"))
    conversation_id = api_id("conv")
    created = store.create_conversation(tenant, conversation_id, metadata, items)
    return conversation_object(conversation_id, created, metadata)


def get_conversation(store: ResponseStore, tenant: str, conversation_id: str
                     ) -> dict[str, Any]:
    """A conversation."""
    found = store.get_conversation(tenant, conversation_id)
    if found is None:
        raise _not_found("conversation", conversation_id, "conversation_id")
    return conversation_object(conversation_id, *found)


def update_conversation(store: ResponseStore, tenant: str, conversation_id: str,
                        body: object) -> dict[str, Any]:
    """Replace a conversation's ``metadata`` (required); the conversation as it is now."""
    fields = _body(body)
    if "metadata" not in fields:
        raise InvalidOptionError("metadata is required", option="metadata")
    if not store.update_conversation(tenant, conversation_id, _metadata(fields["metadata"])):
        raise _not_found("conversation", conversation_id, "conversation_id")
    return get_conversation(store, tenant, conversation_id)


def delete_conversation(store: ResponseStore, tenant: str, conversation_id: str
                        ) -> dict[str, Any]:
    """Delete a conversation and its items."""
    if not store.delete_conversation(tenant, conversation_id):
        raise _not_found("conversation", conversation_id, "conversation_id")
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def create_items(store: ResponseStore, tenant: str, conversation_id: str,
                 body: object) -> dict[str, Any]:
    """Append ``{"items"}`` to a conversation: the items added, as a list."""
    items = _items(_body(body).get("items"))
    if not items:
        raise InvalidOptionError("items must hold at least one item", option="items")
    get_conversation(store, tenant, conversation_id)
    store.add_items(tenant, conversation_id, items)
    return {"object": "list", "data": items, "first_id": items[0]["id"],
            "last_id": items[-1]["id"], "has_more": False}


def list_items(store: ResponseStore, tenant: str, conversation_id: str,
               query: Mapping[str, str]) -> dict[str, Any]:
    """A page of a conversation's items."""
    items = store.items(tenant, conversation_id)
    if items is None:
        raise _not_found("conversation", conversation_id, "conversation_id")
    return page(items, query)


def get_item(store: ResponseStore, tenant: str, conversation_id: str,
             item_id: str) -> dict[str, Any]:
    """One item of a conversation."""
    items = store.items(tenant, conversation_id)
    if items is None:
        raise _not_found("conversation", conversation_id, "conversation_id")
    for item in items:
        if item.get("id") == item_id:
            return item
    raise _not_found("item", item_id, "item_id")


def delete_item(store: ResponseStore, tenant: str, conversation_id: str,
                item_id: str) -> dict[str, Any]:
    """Delete one item of a conversation: the conversation (as OpenAI answers)."""
    conversation = get_conversation(store, tenant, conversation_id)
    if not store.delete_item(tenant, conversation_id, item_id):
        raise _not_found("item", item_id, "item_id")
    return conversation
