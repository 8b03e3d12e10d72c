"""OpenAI chat completions on a :class:`~llamapy.server.Server`: plain, streamed, sync, async.

``chat_completion(target, request)`` returns a ``chat.completion`` dict;
``stream_chat_completion(target, request)`` yields ``chat.completion.chunk`` dicts (the caller
frames them as SSE). ``achat_completion`` / ``astream_chat_completion`` are the asyncio forms.
The streamed deltas add up to exactly the non-streamed message. Closing a stream early cancels
the request on the server.

A stream yields nothing before the engine's first event, so an error that rejects the request
(queue full, context overflow) raises from the first ``next()``, before any chunk is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextlib import aclosing, closing
from typing import Any

from .._native import Model
from ..chat import Delta
from ..engine import DoneEvent, TokenEvent
from ..server import Completion, Server, Usage
from .logprobs import chat_logprob, chat_logprobs
from .params import choice_options
from .prompt import ChatPlan, prepare_chat
from .report import finish_reason, timings_dict, total_usage, usage_dict
from .target import ServedModel, served

Target = Server | Model | ServedModel


def _envelope(plan: ChatPlan, kind: str) -> dict[str, Any]:
    return {"id": plan.id, "object": kind, "created": plan.created, "model": plan.model_name,
            "system_fingerprint": None}


def chat_response(plan: ChatPlan, completion: Completion) -> dict[str, Any]:
    """The ``chat.completion`` object for a finished generation."""
    return chat_choices_response(plan, [completion])


def _choice(plan: ChatPlan, index: int, completion: Completion) -> dict[str, Any]:
    parser = plan.parser()
    parser.feed(completion.text)
    message = parser.finish()
    top = plan.top_logprobs
    logprobs = None if top is None else chat_logprobs(
        plan.served.model, completion.token_ids, completion.logprobs, top)
    return {"index": index, "message": message.to_openai(), "logprobs": logprobs,
            "finish_reason": finish_reason(completion.finish_reason, bool(message.tool_calls))}


def chat_choices_response(plan: ChatPlan, completions: Sequence[Completion]
                          ) -> dict[str, Any]:
    """The ``chat.completion`` object for the ``n`` generations of a request (one choice
    each, usage summed, ``timings`` of the first)."""
    choices = [_choice(plan, index, done) for index, done in enumerate(completions)]
    return {**_envelope(plan, "chat.completion"), "choices": choices,
            "usage": usage_dict(total_usage([done.usage for done in completions])),
            "timings": timings_dict(completions[0].timings, plan.served.model, plan.token_ids)}


class ChatStream:
    """Turns engine events of one request into ``chat.completion.chunk`` dicts."""

    def __init__(self, plan: ChatPlan) -> None:
        self.plan = plan
        self.parser = plan.parser()
        self.model = plan.served.model
        self.started = False
        self.tool_calls = False
        self._pending_logprobs: list[dict[str, Any]] = []

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        logprobs = None
        if self.plan.top_logprobs is not None and self._pending_logprobs:
            logprobs = {"content": self._pending_logprobs, "refusal": None}
            self._pending_logprobs = []
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**_envelope(self.plan, "chat.completion.chunk"), "choices": [choice]}

    def _start(self) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def _delta(self, delta: Delta) -> list[dict[str, Any]]:
        if delta.empty:
            return []
        out: dict[str, Any] = {}
        if delta.reasoning:
            out["reasoning_content"] = delta.reasoning
        if delta.content:
            out["content"] = delta.content
        if delta.tool_call_deltas:
            self.tool_calls = True
            out["tool_calls"] = [piece.to_openai() for piece in delta.tool_call_deltas]
        return [self._chunk(out)]

    def on_token(self, event: TokenEvent) -> list[dict[str, Any]]:
        """Chunks for one generated token (often one, none while text is held back)."""
        chunks = self._start()
        top = self.plan.top_logprobs
        if top is not None:
            self._pending_logprobs.append(
                chat_logprob(self.model, event.token_id, event.logprobs, top))
        return chunks + self._delta(self.parser.feed(event.text))

    def on_done(self, event: DoneEvent) -> list[dict[str, Any]]:
        """The last chunks: held-back text, the finish chunk, then usage if asked for."""
        chunks = self._start() + self._delta(self.parser.flush())
        final = self._chunk({}, finish_reason(event.finish_reason, self.tool_calls))
        final["timings"] = timings_dict(event.timings, self.model, self.plan.token_ids)
        chunks.append(final)
        if self.plan.body.include_usage():
            usage = Usage(event.prompt_tokens, event.completion_tokens,
                          event.timings.reused_tokens)
            chunks.append({**_envelope(self.plan, "chat.completion.chunk"), "choices": [],
                           "usage": usage_dict(usage)})
        return chunks

    def on_event(self, event: TokenEvent | DoneEvent) -> list[dict[str, Any]]:
        """Chunks for any engine event."""
        if isinstance(event, TokenEvent):
            return self.on_token(event)
        return self.on_done(event)


# --- sync -----------------------------------------------------------------------------------


def ready(target: Target, timeout: float | None = None) -> ServedModel:
    """The served model of ``target``, waiting for its model to load."""
    model = served(target)
    model.server.wait_ready(timeout)
    return model


async def aready(target: Target) -> ServedModel:
    """Async :func:`ready` (waits for the load in a worker thread)."""
    model = served(target)
    if not model.server.ready:
        await asyncio.get_running_loop().run_in_executor(None, model.server.wait_ready)
    return model


def chat_completion(target: Target, request: Mapping[str, Any]) -> dict[str, Any]:
    """A ``chat.completion`` for an OpenAI chat request (``stream`` is ignored)."""
    plan = prepare_chat(ready(target), request)
    server = plan.served.server
    return chat_choices_response(plan, [server.complete_tokens(plan.token_ids, **options)
                                        for options in choice_options(plan.options,
                                                                      plan.body.n)])


def stream_chat_completion(target: Target, request: Mapping[str, Any]
                           ) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` dicts for an OpenAI chat request, as they are generated."""
    plan = prepare_chat(ready(target), request)
    return _stream(plan)


def _stream(plan: ChatPlan) -> Iterator[dict[str, Any]]:
    stream = ChatStream(plan)
    with closing(plan.served.events(plan.token_ids, plan.options)) as events:
        for event in events:
            yield from stream.on_event(event)


# --- asyncio --------------------------------------------------------------------------------


async def achat_completion(target: Target, request: Mapping[str, Any]) -> dict[str, Any]:
    """Async :func:`chat_completion`; cancelling the task cancels the request."""
    plan = prepare_chat(await aready(target), request)
    server = plan.served.server
    done = await asyncio.gather(*(server.acomplete_tokens(plan.token_ids, **options)
                                  for options in choice_options(plan.options, plan.body.n)))
    return chat_choices_response(plan, done)


async def astream_chat_completion(target: Target, request: Mapping[str, Any]
                                  ) -> AsyncGenerator[dict[str, Any], None]:
    """Async :func:`stream_chat_completion`; closing the iterator cancels the request."""
    plan = prepare_chat(await aready(target), request)
    stream = ChatStream(plan)
    async with aclosing(plan.served.aevents(plan.token_ids, plan.options)) as events:
        async for event in events:
            for chunk in stream.on_event(event):
                yield chunk
