"""Stored responses and conversations: ``GET``/``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items``, ``POST /v1/responses/{id}/cancel`` and
``/v1/conversations`` with its items (each also without ``/v1``).

Every route sees the calling tenant's objects only (:mod:`llamapy.openai_api.stored_objects`);
with ``--responses-store off`` they answer 501. The store is read on a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from ...errors import EndpointDisabledError, InvalidOptionError
from ...openai_api import stored_objects as objects
from ...openai_api.responses_background import visible
from ..context import AppContext, read_json
from ..routing import Router


def stored_router(ctx: AppContext) -> Router:
    """The stored-object routes (behind the API key)."""
    router = Router(checks=[ctx.check_key])

    async def call(request: Request, work: Callable[..., dict[str, Any]], *args: Any
                   ) -> dict[str, Any]:
        store = ctx.response_store
        if store is None:
            raise EndpointDisabledError("responses are not stored on this server (started "
                                        "with --responses-store off)")
        return await asyncio.to_thread(work, store, ctx.tenant(request), *args)

    for prefix in ("/v1", ""):
        _response_routes(router, call, ctx, f"{prefix}/responses", not prefix)
        _conversation_routes(router, call, f"{prefix}/conversations", not prefix)
        _item_routes(router, call, f"{prefix}/conversations/{{conversation_id}}/items",
                     not prefix)
    return router


Call = Callable[..., Any]


def _ident(request: Request, name: str) -> str:
    return str(request.path_params[name])


def _response_routes(router: Router, call: Call, ctx: AppContext, base: str, hidden: bool
                     ) -> None:
    one = f"{base}/{{response_id}}"

    async def shown(request: Request) -> dict[str, Any]:
        found = await call(request, objects.get_response, _ident(request, "response_id"))
        return visible(ctx.background, ctx.tenant(request), found)

    @router.get(one, hidden=hidden)
    async def get_response(request: Request) -> dict[str, Any]:
        """A stored response (a background one at whatever stage it is)."""
        if request.query_params.get("stream") in ("true", "1"):
            raise InvalidOptionError("stream: background responses are polled, not streamed "
                                     "again", option="stream")
        return await shown(request)

    @router.delete(one, hidden=hidden)
    async def delete_response(request: Request) -> dict[str, Any]:
        """Delete a stored response (a running background one is cancelled first)."""
        if ctx.background is not None:
            await ctx.background.cancel(ctx.tenant(request), _ident(request, "response_id"))
        return await call(request, objects.delete_response, _ident(request, "response_id"))

    @router.get(f"{one}/input_items", hidden=hidden)
    async def input_items(request: Request) -> dict[str, Any]:
        """The input items of a stored response, a page at a time."""
        return await call(request, objects.list_input_items, _ident(request, "response_id"),
                          dict(request.query_params))

    @router.post(f"{one}/cancel", hidden=hidden)
    async def cancel_response(request: Request) -> dict[str, Any]:
        """Cancel a background response: the object, ``cancelled`` (one that had ended
        already as it ended)."""
        if ctx.background is not None:
            await ctx.background.cancel(ctx.tenant(request), _ident(request, "response_id"))
        found = await shown(request)
        if not found.get("background"):
            raise InvalidOptionError("only background responses can be cancelled",
                                     option="response_id")
        return found


def _conversation_routes(router: Router, call: Call, base: str, hidden: bool) -> None:
    one = f"{base}/{{conversation_id}}"

    @router.post(base, hidden=hidden)
    async def create_conversation(request: Request) -> dict[str, Any]:
        """A new conversation (``items``, ``metadata``)."""
        return await call(request, objects.create_conversation, await read_json(request))

    @router.get(one, hidden=hidden)
    async def get_conversation(request: Request) -> dict[str, Any]:
        """A conversation."""
        return await call(request, objects.get_conversation,
                          _ident(request, "conversation_id"))

    @router.post(one, hidden=hidden)
    async def update_conversation(request: Request) -> dict[str, Any]:
        """Replace a conversation's metadata."""
        return await call(request, objects.update_conversation,
                          _ident(request, "conversation_id"), await read_json(request))

    @router.delete(one, hidden=hidden)
    async def delete_conversation(request: Request) -> dict[str, Any]:
        """Delete a conversation."""
        return await call(request, objects.delete_conversation,
                          _ident(request, "conversation_id"))


def _item_routes(router: Router, call: Call, items: str, hidden: bool) -> None:
    @router.post(items, hidden=hidden)
    async def create_items(request: Request) -> dict[str, Any]:
        """Add items to a conversation."""
        return await call(request, objects.create_items, _ident(request, "conversation_id"),
                          await read_json(request))

    @router.get(items, hidden=hidden)
    async def list_items(request: Request) -> dict[str, Any]:
        """A conversation's items, a page at a time."""
        return await call(request, objects.list_items, _ident(request, "conversation_id"),
                          dict(request.query_params))

    @router.get(f"{items}/{{item_id}}", hidden=hidden)
    async def get_item(request: Request) -> dict[str, Any]:
        """One item of a conversation."""
        return await call(request, objects.get_item, _ident(request, "conversation_id"),
                          _ident(request, "item_id"))

    @router.delete(f"{items}/{{item_id}}", hidden=hidden)
    async def delete_item(request: Request) -> dict[str, Any]:
        """Delete one item of a conversation."""
        return await call(request, objects.delete_item, _ident(request, "conversation_id"),
                          _ident(request, "item_id"))
