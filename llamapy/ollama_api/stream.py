"""Ollama's answers: NDJSON chunks while generating, then one final object with the stats.

:class:`OllamaStream` turns the engine events of one request into Ollama chunks: ``/api/chat``
chunks carry ``message`` (``content``, ``thinking``), ``/api/generate`` chunks ``response``
and ``thinking``; every chunk has ``model``, ``created_at`` (RFC 3339) and ``done``. Parsed
tool calls come in one chunk of their own once the answer is complete (``arguments`` an
object). The last object has ``done: true``, ``done_reason`` (``stop`` or ``length``), for
``/api/generate`` without ``raw`` the ``context`` (the prompt's and the answer's tokens), and the
counts and durations (nanoseconds): ``prompt_eval_count`` is the prompt tokens computed for
this request (a prefix reused from the cache is not evaluated again), ``eval_count`` the
generated tokens, ``load_duration`` 0 (the model was loaded before the request ran). With
``logprobs``, a chunk carries the ``logprobs`` of the tokens since the last chunk (a token that
released no text yet comes with the next one). Arguments that are not a JSON object come back
as ``{}``.

:func:`collect` adds the chunks up into the single object of a non-streamed answer, so both
forms say the same thing. Nothing is yielded before the engine's first event, so a rejected
request raises before any byte is sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from datetime import datetime, timezone
from typing import Any

from ..chat import Delta
from ..chat.delta import MessageBuilder
from ..engine import DoneEvent, StreamEvent, TokenEvent
from ..openai_api.bridge import Observer
from ..openai_api.logprobs import chat_logprob
from ..openai_api.report import finish_reason, timings_dict
from .prompt import OllamaPlan


def created_at() -> str:
    """Now, in RFC 3339 (UTC, with the ``Z`` Ollama writes)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def arguments(text: str) -> dict[str, Any]:
    """A parsed call's JSON arguments as an object (``{}`` when they are not one)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def done_stats(plan: OllamaPlan, event: DoneEvent) -> dict[str, Any]:
    """The final object's ``done_reason``, counts and durations (ns)."""
    timings = event.timings
    return {"done": True, "done_reason": finish_reason(str(event.finish_reason)),
            "total_duration": time.perf_counter_ns() - plan.started_ns,
            "load_duration": 0,
            "prompt_eval_count": max(0, event.prompt_tokens - timings.reused_tokens),
            "prompt_eval_duration": int(timings.prefill_s * 1e9),
            "eval_count": event.completion_tokens,
            "eval_duration": int(timings.decode_s * 1e9)}


class OllamaStream:
    """Turns the engine events of one request into Ollama chunks."""

    def __init__(self, plan: OllamaPlan) -> None:
        self.plan = plan
        self.parser = plan.parser()
        self.calls = MessageBuilder()
        self.logprobs: list[dict[str, Any]] = []
        self.generated: list[int] = []

    def chunk(self, content: str = "", thinking: str = "", **more: Any) -> dict[str, Any]:
        """One object of the answer (``done`` false unless ``more`` says otherwise)."""
        out: dict[str, Any] = {"model": self.plan.model, "created_at": created_at()}
        if self.plan.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            out["message"] = message
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        if self.logprobs:
            out["logprobs"], self.logprobs = self.logprobs, []
        out["done"] = False
        out.update(more)
        return out

    def _delta(self, delta: Delta) -> list[dict[str, Any]]:
        if delta.tool_call_deltas:
            self.calls.add(Delta(tool_call_deltas=delta.tool_call_deltas))
        if not (delta.content or delta.reasoning):
            return []
        return [self.chunk(delta.content, delta.reasoning)]

    def _tool_calls(self) -> list[dict[str, Any]]:
        calls = self.calls.build().tool_calls
        if not calls:
            return []
        chunk = self.chunk()
        chunk["message"]["tool_calls"] = [
            {"id": call.id, "function": {"index": i, "name": call.name,
                                         "arguments": arguments(call.arguments)}}
            for i, call in enumerate(calls)]
        return [chunk]

    def on_event(self, event: StreamEvent) -> list[dict[str, Any]]:
        """Chunks for any engine event (none for progress events)."""
        if isinstance(event, TokenEvent):
            self.generated.append(event.token_id)
            top = self.plan.top_logprobs
            if top is not None:
                self.logprobs.append(chat_logprob(self.plan.served.model, event.token_id,
                                                  event.logprobs, top))
            return self._delta(self.parser.feed(event.text))
        if not isinstance(event, DoneEvent):
            return []
        flushed = self.parser.flush(truncated=event.finish_reason == "max_tokens")
        out = self._delta(flushed) + self._tool_calls()
        out.append(self.chunk(**done_stats(self.plan, event)))
        if self.plan.returns_context:
            out[-1]["context"] = [*self.plan.token_ids, *self.generated]
        return out


async def astream(plan: OllamaPlan, observe: Observer | None = None
                  ) -> AsyncGenerator[dict[str, Any], None]:
    """The chunks of ``plan`` as they are generated; closing the iterator cancels the request.
    ``observe`` receives the request's ``timings`` (llama-server's keys)."""
    stream = OllamaStream(plan)
    async with aclosing(plan.served.aevents(plan.token_ids, plan.intent)) as events:
        async for event in events:
            if isinstance(event, DoneEvent) and observe is not None:
                observe(timings_dict(event.timings, plan.served.model, plan.token_ids))
            for chunk in stream.on_event(event):
                yield chunk


def collect(chunks: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The single object of a non-streamed answer: the last chunk with the whole text."""
    final = dict(chunks[-1])
    logprobs = [entry for c in chunks for entry in c.get("logprobs", [])]
    if logprobs:
        final["logprobs"] = logprobs
    if "message" not in final:
        final["response"] = "".join(str(c.get("response", "")) for c in chunks)
        thinking = "".join(str(c.get("thinking", "")) for c in chunks)
        if thinking:
            final["thinking"] = thinking
        return final
    parts = [c["message"] for c in chunks]
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(str(m.get("content", "")) for m in parts)}
    thinking = "".join(str(m.get("thinking", "")) for m in parts)
    calls = [call for m in parts for call in m.get("tool_calls", [])]
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = calls
    final["message"] = message
    return final


async def acomplete(plan: OllamaPlan, observe: Observer | None = None) -> dict[str, Any]:
    """The whole answer of ``plan`` as one object; cancelling the task cancels the request."""
    async with aclosing(astream(plan, observe)) as chunks:
        return collect([chunk async for chunk in chunks])
