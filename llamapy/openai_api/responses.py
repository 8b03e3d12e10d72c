"""OpenAI Responses on a :class:`~llamapy.server.Server`: whole, streamed, sync, async.

``create_response(target, request)`` returns a ``response`` object (``output`` items:
``reasoning``, ``message`` with ``output_text``, ``function_call``; ``usage`` with
``input_tokens_details.cached_tokens``; ``status`` ``incomplete`` with
``incomplete_details`` when ``max_output_tokens`` ran out). ``stream_response`` yields the
typed stream events: ``response.created``, ``response.in_progress``, per item
``response.output_item.added``, ``response.content_part.added``, the deltas
(``response.output_text.delta``, ``response.reasoning_text.delta``,
``response.function_call_arguments.delta``) and their ``.done`` events,
``response.content_part.done``, ``response.output_item.done``, and finally
``response.completed`` (or ``response.incomplete``), each with its ``sequence_number``.
An ``input`` that ends with ``{"type": "compaction_trigger"}`` is answered with one
``compaction`` item (:mod:`.responses_trigger`).
Nothing is yielded before the engine's first event, so a rejected request raises from the
first ``next()``. ``a*`` are the asyncio forms.

``count_input_tokens`` and ``count_chat_input_tokens`` count the prompt of a Responses or a
chat request without generating (``{"object": "response.input_tokens", "input_tokens"}``,
as llama-server answers both).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from contextlib import aclosing
from typing import Any

from ..engine import DoneEvent, ProgressEvent, StreamEvent, TokenEvent
from ..errors import InvalidOptionError
from ..server import Completion, Usage
from .bridge import Observer, aplan_events, arun_plan, plan_events, run_plan
from .chat import Target, aready, ready
from .prompt import prepare_chat
from .report import per_token_timings, progress_dict
from .responses_input import ResponsesPlan, prepare_responses
from .responses_output import (
    ItemBuilder,
    output_items,
    reasoning_tokens,
    response_object,
    response_status,
    usage_dict,
)
from .responses_trigger import (
    acompaction_events,
    acompaction_response,
    asks_compaction,
    compaction_events,
    compaction_response,
)


def response_from(plan: ResponsesPlan, completion: Completion) -> dict[str, Any]:
    """The ``response`` object of a finished generation."""
    status = response_status(completion.finish_reason)
    items = output_items(plan, completion.text, status)
    usage = usage_dict(completion.usage, reasoning_tokens(plan, items))
    return response_object(plan, status=status, output=items, usage=usage)


class ResponseStream:
    """Turns the engine events of one request into numbered Responses stream events."""

    def __init__(self, plan: ResponsesPlan) -> None:
        self.plan = plan
        self.parser = plan.chat.parser()
        self.items = ItemBuilder(encrypt_reasoning=plan.encrypt_reasoning,
                                 namespaces=plan.namespaces)
        self.started = False
        self.sequence_number = 0

    def _numbered(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for event in events:
            event["sequence_number"] = self.sequence_number
            self.sequence_number += 1
        return events

    def _start(self) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        return [{"type": kind, "response": response_object(
                    self.plan, status="in_progress", output=[], usage=None)}
                for kind in ("response.created", "response.in_progress")]

    def on_done(self, event: DoneEvent) -> list[dict[str, Any]]:
        """The last events: held-back output, closing the item, the final response."""
        status = response_status(event.finish_reason)
        flushed = self.parser.flush(truncated=event.finish_reason == "max_tokens")
        events = self._start() + self.items.add(flushed) + self.items.finish(status)
        output = self.items.items
        usage = Usage(event.prompt_tokens, event.completion_tokens, event.timings.reused_tokens)
        final = response_object(self.plan, status=status, output=output,
                                usage=usage_dict(usage, reasoning_tokens(self.plan, output)))
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, {"type": kind, "response": final, **self._timings(event)}]

    def _timings(self, event: StreamEvent) -> dict[str, Any]:
        return per_token_timings(event, self.plan.chat.served.model, self.plan.chat.token_ids)

    def on_progress(self, event: ProgressEvent) -> list[dict[str, Any]]:
        """llama-server's prompt progress (``return_progress``): ``response.in_progress``
        with ``prompt_progress``."""
        events = self._start()
        progress = {"type": "response.in_progress", "response": response_object(
            self.plan, status="in_progress", output=[], usage=None),
            "prompt_progress": progress_dict(event), **self._timings(event)}
        return [*events, progress]

    def on_event(self, event: StreamEvent) -> list[dict[str, Any]]:
        """Numbered stream events for any engine event (with ``timings_per_token`` the last
        event of a token carries the timings so far)."""
        if isinstance(event, TokenEvent):
            events = self._start() + self.items.add(self.parser.feed(event.text))
            if events:
                events[-1].update(self._timings(event))
        elif isinstance(event, ProgressEvent):
            events = self.on_progress(event)
        else:
            events = self.on_done(event)
        return self._numbered(events)


# --- library functions ------------------------------------------------------------------------


def create_response(target: Target, request: Mapping[str, Any], *,
                    observe: Observer | None = None) -> dict[str, Any]:
    """A ``response`` for a Responses request (``stream`` is ignored); ``observe`` receives
    the request's ``timings``. An ``input`` ending in a ``compaction_trigger`` is a compaction
    (:mod:`.responses_trigger`)."""
    if asks_compaction(request):
        return compaction_response(target, request, observe=observe)
    plan = prepare_responses(ready(target), request)
    return response_from(plan, run_plan(plan.chat, observe))


async def acreate_response(target: Target, request: Mapping[str, Any], *,
                           observe: Observer | None = None) -> dict[str, Any]:
    """Async :func:`create_response`; cancelling the task cancels the request."""
    if asks_compaction(request):
        return await acompaction_response(target, request, observe=observe)
    plan = await asyncio.to_thread(prepare_responses, await aready(target), request)
    return response_from(plan, await arun_plan(plan.chat, observe))


async def abackground_response(target: Target, request: Mapping[str, Any], *,
                               observe: Observer | None = None
                               ) -> tuple[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]]]:
    """A request prepared to run in the background: its ``response`` object while queued,
    and the work that runs it to its final object (see :mod:`.responses_background`)."""
    if asks_compaction(request):
        raise InvalidOptionError("a compaction does not run in the background",
                                 option="background")
    plan = await asyncio.to_thread(prepare_responses, await aready(target), request)

    async def work() -> dict[str, Any]:
        return response_from(plan, await arun_plan(plan.chat, observe))

    return response_object(plan, status="queued", output=[], usage=None), work


def stream_response(target: Target, request: Mapping[str, Any], *,
                    observe: Observer | None = None) -> Iterator[dict[str, Any]]:
    """Responses stream events as they are generated; closing the iterator cancels."""
    if asks_compaction(request):
        return compaction_events(target, request, observe=observe)
    plan = prepare_responses(ready(target), request)
    return plan_events(plan.chat, ResponseStream(plan).on_event, observe)


async def astream_response(target: Target, request: Mapping[str, Any], *,
                           observe: Observer | None = None
                           ) -> AsyncGenerator[dict[str, Any], None]:
    """Async :func:`stream_response`."""
    if asks_compaction(request):
        events = acompaction_events(target, request, observe=observe)
    else:
        plan = await asyncio.to_thread(prepare_responses, await aready(target), request)
        events = aplan_events(plan.chat, ResponseStream(plan).on_event, observe)
    async with aclosing(events):
        async for event in events:
            yield event


def _count(tokens: int) -> dict[str, Any]:
    return {"object": "response.input_tokens", "input_tokens": tokens}


def count_input_tokens(target: Target, request: Mapping[str, Any]) -> dict[str, Any]:
    """The prompt tokens of a Responses request, nothing generated."""
    return _count(len(prepare_responses(ready(target), request).chat.token_ids))


def count_chat_input_tokens(target: Target, request: Mapping[str, Any]) -> dict[str, Any]:
    """The prompt tokens of a chat completions request, nothing generated."""
    return _count(len(prepare_chat(ready(target), request).token_ids))
