"""Compaction inside ``/v1/responses``: an ``input`` that ends with
``{"type": "compaction_trigger"}`` (how Codex compacts over the Responses WebSocket).

Such a request is answered as ``/v1/responses/compact`` answers the same history
(:mod:`.responses_compact`: the summary written by the served model on the prompt the next turn
renders, its KV reused), with one difference in the answer: ``output`` is the ``compaction``
item alone (the client keeps the user messages it wants itself). It is a ``response``
object (``object: "response"``, the request's fields echoed); streamed, its events are
``response.created``, ``response.in_progress``, ``response.output_item.added`` and
``.done`` for the item, and ``response.completed``.

The request's generation fields (``stream``, ``store``, ``include``, ``tool_choice``,
``temperature``, ``top_p``, ``max_output_tokens``, ``metadata``, ...) change nothing in the
summarising run; its prompt fields (``instructions``, ``tools``, ``reasoning``,
``prompt_cache_key``, the engine options and API extras) are the compact request's. A
``compaction_trigger`` anywhere else in a history renders as nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator, Mapping
from typing import Any

from .bridge import Observer, api_id
from .chat import Target, aready, ready
from .params import parse_body
from .responses_compact import COMPACT_FIELDS, acompact_response, compact_response
from .responses_output import response_fields
from .responses_params import RESPONSES_FIELDS, ResponsesBody, parse_item

#: The item that asks for a compaction.
TRIGGER = "compaction_trigger"

#: Responses fields the summarising run does not take.
_DROPPED = frozenset(RESPONSES_FIELDS) - frozenset(COMPACT_FIELDS)


def asks_compaction(request: object) -> bool:
    """Whether ``request`` is a compaction: its last ``input`` item is the trigger (a body
    that is no object is not one: it is refused where it is parsed)."""
    items = request.get("input") if isinstance(request, Mapping) else None
    last = items[-1] if isinstance(items, list) and items else None
    return isinstance(last, Mapping) and last.get("type") == TRIGGER


def compact_body(request: Mapping[str, Any]) -> dict[str, Any]:
    """The ``/v1/responses/compact`` body standing for a triggered ``request``."""
    items = list(request["input"])
    parse_item(items[-1], f"input[{len(items) - 1}]")  # the trigger has no other field
    body = {key: value for key, value in request.items() if key not in _DROPPED}
    body["input"] = items[:-1]
    return body


def _response(request: Mapping[str, Any], compacted: dict[str, Any], model: str
              ) -> dict[str, Any]:
    echoed = parse_body(ResponsesBody, {**request, "input": list(request["input"])[:-1]})
    return response_fields(echoed, id=api_id("resp"), created_at=compacted["created_at"],
                           model=model, status="completed", output=compacted["output"][-1:],
                           usage=compacted["usage"])


def _events(response: dict[str, Any]) -> list[dict[str, Any]]:
    item = response["output"][0]
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    events = [{"type": "response.created", "response": opening},
              {"type": "response.in_progress", "response": opening},
              {"type": "response.output_item.added", "output_index": 0, "item": item},
              {"type": "response.output_item.done", "output_index": 0, "item": item},
              {"type": "response.completed", "response": response}]
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def compaction_response(target: Target, request: Mapping[str, Any], *,
                        observe: Observer | None = None) -> dict[str, Any]:
    """The ``response`` to a triggered ``request``: its one output item the compaction."""
    served = ready(target)
    compacted = compact_response(served, compact_body(request), observe=observe)
    return _response(request, compacted, served.name)


async def acompaction_response(target: Target, request: Mapping[str, Any], *,
                               observe: Observer | None = None) -> dict[str, Any]:
    """Async :func:`compaction_response`; cancelling the task cancels the request."""
    served = await aready(target)
    compacted = await acompact_response(served, compact_body(request), observe=observe)
    return await asyncio.to_thread(_response, request, compacted, served.name)


def compaction_events(target: Target, request: Mapping[str, Any], *,
                      observe: Observer | None = None) -> Iterator[dict[str, Any]]:
    """The stream events of :func:`compaction_response` (sent once the summary is written)."""
    yield from _events(compaction_response(target, request, observe=observe))


async def acompaction_events(target: Target, request: Mapping[str, Any], *,
                             observe: Observer | None = None
                             ) -> AsyncGenerator[dict[str, Any], None]:
    """Async :func:`compaction_events`."""
    for event in _events(await acompaction_response(target, request, observe=observe)):
        yield event
