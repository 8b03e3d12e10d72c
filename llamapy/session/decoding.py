"""One decode pass of a session: sampling parameters, output parsing, structured output."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from llamapy.chat.delta import ToolCall, new_tool_call_id
from llamapy.chat.parsers import OutputParser, prompt_opens_reasoning, protocol_kind
from llamapy.engine.backend import BatchPlan, Segment
from llamapy.engine.engine import Engine
from llamapy.engine.options import SamplingParams
from llamapy.errors import InvalidOptionError, UnsupportedFeatureError
from llamapy.grammar.json_schema import schema_to_gbnf
from llamapy.session.config import DecodeConfig, StreamChunk, decode_sampling

__all__ = ["DecodeRun", "async_stream", "next_token_logits"]


class DecodeRun:
    """Turns a :class:`DecodeConfig` into sampling parameters and engine text into chunks.

    Raises at construction (before anything is submitted): ``UnsupportedFeatureError`` for an
    unknown parser protocol, ``InvalidOptionError`` / ``GrammarError`` for bad values.
    ``prompt_tail`` is the text the resident tokens end with: when it ends with the reasoning
    protocol's start marker (a suffix that opens ``<think>``), output begins inside reasoning.
    """

    def __init__(self, config: DecodeConfig, defaults: SamplingParams,
                 prompt_tail: str = "") -> None:
        self.config = config
        self.tool_json = config.structured_output.kind == "json_schema_tool_calls"
        self.sampling = self._sampling(config, defaults)
        protocols = list(config.parser_protocols)
        for name in protocols:
            protocol_kind(name)  # unknown names raise UnsupportedFeatureError
        if config.reasoning_format == "none":
            protocols = [p for p in protocols if protocol_kind(p) != "reasoning"]
        started = any(protocol_kind(p) == "reasoning" and prompt_opens_reasoning(prompt_tail, p)
                      for p in protocols)
        self.parser = OutputParser.from_protocols(protocols, reasoning_started=started)
        self._json: list[str] = []

    @staticmethod
    def _sampling(config: DecodeConfig, defaults: SamplingParams) -> SamplingParams:
        changes: dict[str, Any] = decode_sampling(config)
        structured = config.structured_output
        if structured.kind == "grammar":
            changes["grammar"] = structured.grammar
        elif structured.kind != "none":
            assert structured.schema is not None
            changes["grammar"] = schema_to_gbnf(structured.schema)
        return replace(defaults, **changes)

    def feed(self, text: str) -> StreamChunk | None:
        """A chunk for newly released text, None when there is nothing to stream."""
        if not text:
            return None
        if self.tool_json:
            self._json.append(text)
            return None
        delta = self.parser.feed(text)
        if not (delta.content or delta.reasoning):
            return None
        return StreamChunk(text=delta.content, thinking=delta.reasoning)

    def finish(self, finish_reason: str) -> StreamChunk:
        """The last chunk: held-back text and the finished tool calls."""
        if self.tool_json:
            return StreamChunk(tool_calls=_json_tool_calls("".join(self._json)),
                               finish_reason=finish_reason)
        delta = self.parser.flush()
        message = self.parser.finish()
        return StreamChunk(text=delta.content, thinking=delta.reasoning,
                           tool_calls=message.tool_calls, finish_reason=finish_reason)


def _json_tool_calls(text: str) -> tuple[ToolCall, ...]:
    """Tool calls from constrained JSON: ``{"name", "arguments"}`` or a list of them."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidOptionError(f"constrained output is not JSON: {exc}",
                                 option="structured_output") from exc
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidOptionError("tool-call JSON needs a string 'name'",
                                     option="structured_output")
        arguments = item.get("arguments", {})
        calls.append(ToolCall(id=new_tool_call_id(), name=item["name"],
                              arguments=json.dumps(arguments)))
    return tuple(calls)


def next_token_logits(engine: Engine, lease_id: int, resident: list[int]) -> np.ndarray:
    """On the engine's thread, between ticks: recompute the last resident token of the leased
    sequence and return a copy of its logits; the KV ends as it was (all of ``resident``)."""
    backend = engine.backend
    ctx = getattr(backend, "ctx", None)
    if ctx is None or not backend.supports_partial_removal:
        raise UnsupportedFeatureError("next_token_logits")
    seq, n = engine.lease_seq_id(lease_id), len(resident)
    backend.seq_rm(seq, n - 1, -1)
    backend.decode(BatchPlan([Segment(seq, n - 1, [resident[-1]], logits=True)]))
    out = np.array(ctx.logits(0), copy=True)
    engine.set_slot_tokens(lease_id, resident)
    return out


async def async_stream(stream: Generator[StreamChunk, None, None]) -> AsyncIterator[StreamChunk]:
    """``stream`` as an async iterator, run on its own worker thread so that waiting for the
    engine never blocks the event loop. Closing or cancelling early closes ``stream`` on that
    thread after the step in flight (one thread serialises them, so a generator is never
    closed while it runs)."""
    loop = asyncio.get_running_loop()
    worker = ThreadPoolExecutor(1, thread_name_prefix="llamapy-adecode")
    try:
        while (chunk := await loop.run_in_executor(worker, next, stream, None)) is not None:
            yield chunk
    finally:
        await asyncio.shield(loop.run_in_executor(worker, stream.close))
        worker.shutdown(wait=False)
