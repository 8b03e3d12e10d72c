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

from ..chat import Delta
from ..engine import DoneEvent, ProgressEvent, StreamEvent, TokenEvent
from ..server import Completion, GenerationIntent, Model, Server, Usage
from .logprobs import chat_logprob, chat_logprobs
from .prompt import ChatPlan, prepare_chat
from .report import (
    SYSTEM_FINGERPRINT,
    finish_reason,
    per_token_timings,
    progress_dict,
    timings_dict,
    total_usage,
    usage_dict,
)
from .target import ServedModel, served

Target = Server | Model | ServedModel


def _envelope(plan: ChatPlan, kind: str) -> dict[str, Any]:
    return {"id": plan.id, "object": kind, "created": plan.created, "model": plan.model_name,
            "system_fingerprint": SYSTEM_FINGERPRINT}


def chat_response(plan: ChatPlan, completion: Completion) -> dict[str, Any]:
    """The ``chat.completion`` object for a finished generation."""
    return chat_choices_response(plan, [completion])


def _choice(plan: ChatPlan, index: int, completion: Completion) -> dict[str, Any]:
    parser = plan.parser()
    parser.feed(completion.text)
    message = parser.finish(truncated=completion.finish_reason == "max_tokens")
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
    out = {**_envelope(plan, "chat.completion"), "choices": choices,
           "usage": usage_dict(total_usage([done.usage for done in completions])),
           "timings": timings_dict(completions[0].timings, plan.served.model, plan.token_ids)}
    if plan.verbose:
        first = completions[0]
        out["__verbose"] = verbose_dict(plan, first.text, first.completion_tokens,
                                        str(first.finish_reason))
    return out


def verbose_dict(plan: ChatPlan, text: str, completion_tokens: int, reason: str
                 ) -> dict[str, Any]:
    """llama-server's ``__verbose`` object (``verbose``, ``--verbose``): the rendered prompt
    and the raw generated text of the first choice."""
    return {"prompt": plan.prompt, "content": text, "tokens_evaluated": len(plan.token_ids),
            "tokens_predicted": completion_tokens, "stop_type": reason, "model": plan.model_name}


class ChatStream:
    """Turns engine events of one request into ``chat.completion.chunk`` dicts (of choice
    ``index``; ``usage=False``: no usage chunk, the caller sums the choices'). The first chunk
    is the role alone, its ``content`` null, as llama-server sends it."""

    def __init__(self, plan: ChatPlan, index: int = 0, *, usage: bool = True) -> None:
        self.plan = plan
        self.index = index
        self.usage = usage
        self.final_usage: Usage | None = None
        self.parser = plan.parser()
        self.model = plan.served.model
        self.started = False
        self.tool_calls = False
        self._pending_logprobs: list[dict[str, Any]] = []
        self._text: list[str] = []

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        logprobs = None
        if self.plan.top_logprobs is not None and self._pending_logprobs:
            logprobs = {"content": self._pending_logprobs, "refusal": None}
            self._pending_logprobs = []
        choice = {"index": self.index, "delta": delta, "logprobs": logprobs,
                  "finish_reason": finish}
        return {**_envelope(self.plan, "chat.completion.chunk"), "choices": [choice]}

    def _start(self) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        return [self._chunk({"role": "assistant", "content": None})]

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
        """Chunks for one generated token (often one, none while text is held back; the
        last carries the timings so far with ``timings_per_token``)."""
        chunks = self._start()
        top = self.plan.top_logprobs
        if top is not None:
            self._pending_logprobs.append(
                chat_logprob(self.model, event.token_id, event.logprobs, top))
        self._text.append(event.text)
        deltas = self._delta(self.parser.feed(event.text))
        if deltas:
            deltas[-1].update(per_token_timings(event, self.model, self.plan.token_ids))
        return chunks + deltas

    def on_progress(self, event: ProgressEvent) -> list[dict[str, Any]]:
        """llama-server's prompt progress chunk (``return_progress``): the role delta with
        ``prompt_progress``."""
        self.started = True
        chunk = self._chunk({"role": "assistant", "content": None})
        chunk["prompt_progress"] = progress_dict(event)
        chunk.update(per_token_timings(event, self.model, self.plan.token_ids))
        return [chunk]

    def on_done(self, event: DoneEvent) -> list[dict[str, Any]]:
        """The last chunks: held-back text, the finish chunk, then usage if asked for."""
        truncated = event.finish_reason == "max_tokens"
        chunks = self._start() + self._delta(self.parser.flush(truncated=truncated))
        final = self._chunk({}, finish_reason(event.finish_reason, self.tool_calls))
        final["timings"] = timings_dict(event.timings, self.model, self.plan.token_ids)
        if self.plan.verbose:
            final["__verbose"] = verbose_dict(self.plan, "".join(self._text),
                                              event.completion_tokens, str(event.finish_reason))
        chunks.append(final)
        self.final_usage = Usage(event.prompt_tokens, event.completion_tokens,
                                 event.timings.reused_tokens)
        if self.plan.request.include_usage and self.usage:
            chunks.append({**usage_chunk(self.plan, [self.final_usage]),
                           "timings": final["timings"]})
        return chunks

    def on_event(self, event: StreamEvent) -> list[dict[str, Any]]:
        """Chunks for any engine event."""
        if isinstance(event, TokenEvent):
            return self.on_token(event)
        if isinstance(event, ProgressEvent):
            return self.on_progress(event)
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
    intents = plan.served.choices(plan.intent, plan.request.n)
    return chat_choices_response(plan, [plan.served.complete(plan.token_ids, intent)
                                        for intent in intents])


def stream_chat_completion(target: Target, request: Mapping[str, Any]
                           ) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` dicts for an OpenAI chat request, as they are generated."""
    plan = prepare_chat(ready(target), request)
    return _stream(plan)


def _stream(plan: ChatPlan) -> Iterator[dict[str, Any]]:
    """The chunks of each choice in turn (``n`` > 1: one choice generated after another)."""
    streams = [ChatStream(plan, i, usage=plan.request.n == 1) for i in range(plan.request.n)]
    for stream, options in zip(streams, plan.served.choices(plan.intent, plan.request.n),
                               strict=True):
        with closing(plan.served.events(plan.token_ids, options)) as events:
            for event in events:
                yield from stream.on_event(event)
    if plan.request.n > 1 and plan.request.include_usage:
        yield usage_chunk(plan, [s.final_usage for s in streams if s.final_usage])


def usage_chunk(plan: ChatPlan, usages: Sequence[Usage]) -> dict[str, Any]:
    """The final ``choices: []`` chunk carrying the (summed) usage."""
    return {**_envelope(plan, "chat.completion.chunk"), "choices": [],
            "usage": usage_dict(total_usage(list(usages)))}


# --- asyncio --------------------------------------------------------------------------------


async def achat_completion(target: Target, request: Mapping[str, Any]) -> dict[str, Any]:
    """Async :func:`chat_completion`; cancelling the task cancels the request."""
    plan = await asyncio.to_thread(prepare_chat, await aready(target), request)
    done = await plan.served.acomplete_all(
        [(plan.token_ids, options) for options in plan.served.choices(plan.intent, plan.request.n)])
    return chat_choices_response(plan, done)


async def astream_chat_completion(target: Target, request: Mapping[str, Any]
                                  ) -> AsyncGenerator[dict[str, Any], None]:
    """Async :func:`stream_chat_completion`; closing the iterator cancels the request."""
    plan = await asyncio.to_thread(prepare_chat, await aready(target), request)
    if plan.request.n > 1:
        async with aclosing(_astream_choices(plan)) as chunks:
            async for chunk in chunks:
                yield chunk
        return
    stream = ChatStream(plan)
    async with aclosing(plan.served.aevents(plan.token_ids, plan.intent)) as events:
        async for event in events:
            for chunk in stream.on_event(event):
                yield chunk


async def _astream_choices(plan: ChatPlan) -> AsyncGenerator[dict[str, Any], None]:
    """The ``n`` choices generated concurrently, their chunks interleaved as they come (each
    carries its ``index``), then the summed usage if asked for. The first failure ends the
    stream with its error and cancels the other choices."""
    n = plan.request.n
    plan.served.server.check_fits_at_once(n)
    queue: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
    streams = [ChatStream(plan, i, usage=False) for i in range(n)]

    async def pump(stream: ChatStream, options: GenerationIntent) -> None:
        try:
            async with aclosing(plan.served.aevents(plan.token_ids, options)) as events:
                async for event in events:
                    for chunk in stream.on_event(event):
                        queue.put_nowait(chunk)
        except Exception as exc:  # delivered to the consumer, which raises it
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(s, o))
             for s, o in zip(streams, plan.served.choices(plan.intent, n), strict=True)]
    try:
        for _ in range(n):
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        if plan.request.include_usage:
            yield usage_chunk(plan, [s.final_usage for s in streams if s.final_usage])
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
