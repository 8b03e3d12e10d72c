"""Streamed Anthropic Messages: the event sequence of the Messages streaming API.

``message_start`` (the message with empty ``content`` and its ``usage``), then per content
block ``content_block_start``, ``content_block_delta`` (``thinking_delta`` and
``signature_delta``, ``text_delta``, ``input_json_delta``) and ``content_block_stop`` with
increasing ``index``, then ``message_delta`` (``stop_reason``, ``stop_sequence``, ``usage``)
and ``message_stop``. Each event is a dict whose ``type`` is its SSE event name.

Nothing is yielded before the engine's first event, so a rejected request raises from the
first ``next()``. ``message_start`` reports the whole prompt as ``input_tokens``; the final
``message_delta`` carries the split into computed, written and reused tokens (cumulative counts
overwrite, as the Messages API defines them), so the accumulated message equals the
non-streamed one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator, Mapping
from contextlib import aclosing
from typing import Any

from ..engine import DoneEvent, ProgressEvent, StreamEvent, TokenEvent
from ..openai_api.bridge import Observer, aplan_events, plan_events
from ..openai_api.chat import Target, aready, ready
from .blocks import BlockBuilder
from .messages import envelope, stop_reason, usage_dict
from .prompt import MessagesPlan, prepare_messages


class MessageStream:
    """Turns the engine events of one request into Messages stream events."""

    def __init__(self, plan: MessagesPlan) -> None:
        self.plan = plan
        self.parser = plan.chat.parser()
        self.blocks = BlockBuilder()
        self.started = False

    def _start(self) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        prompt_tokens = len(self.plan.chat.token_ids)
        message = {**envelope(self.plan), "content": [], "stop_reason": None,
                   "stop_sequence": None, "usage": usage_dict(prompt_tokens, 0, 0)}
        return [{"type": "message_start", "message": message}]

    def on_done(self, event: DoneEvent) -> list[dict[str, Any]]:
        """The last events: held-back output, closing the block, the stop reason, the end."""
        flushed = self.parser.flush(truncated=event.finish_reason == "max_tokens")
        events = self._start() + self.blocks.add(flushed) + self.blocks.finish()
        reason, sequence = stop_reason(event.finish_reason, event.stop_word,
                                       self.blocks.has_tool_use)
        usage = usage_dict(event.prompt_tokens, event.timings.reused_tokens,
                           event.completion_tokens, event.timings.pinned_tokens)
        events.append({"type": "message_delta",
                       "delta": {"stop_reason": reason, "stop_sequence": sequence},
                       "usage": usage})
        events.append({"type": "message_stop"})
        return events

    def on_event(self, event: StreamEvent) -> list[dict[str, Any]]:
        """Stream events for any engine event."""
        if isinstance(event, TokenEvent):
            return self._start() + self.blocks.add(self.parser.feed(event.text))
        if isinstance(event, ProgressEvent):  # no such event in Anthropic's stream
            return []
        return self.on_done(event)


def stream_message(target: Target, request: Mapping[str, Any], *,
                   observe: Observer | None = None) -> Iterator[dict[str, Any]]:
    """Messages stream events for an Anthropic Messages request, as they are generated;
    closing the iterator cancels the request."""
    plan = prepare_messages(ready(target), request)
    return plan_events(plan.chat, MessageStream(plan).on_event, observe)


async def astream_message(target: Target, request: Mapping[str, Any], *,
                          observe: Observer | None = None
                          ) -> AsyncGenerator[dict[str, Any], None]:
    """Async :func:`stream_message`."""
    plan = await asyncio.to_thread(prepare_messages, await aready(target), request)
    events = aplan_events(plan.chat, MessageStream(plan).on_event, observe)
    async with aclosing(events):
        async for item in events:
            yield item
