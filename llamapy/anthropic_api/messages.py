"""Anthropic Messages on a :class:`~llamapy.server.Server`: whole messages and token counts.

``create_message(target, request)`` returns a ``message`` dict as the Messages API does
(``content`` blocks, ``stop_reason``, ``stop_sequence``, ``usage``); ``acreate_message`` is
the asyncio form; ``count_message_tokens`` answers ``count_tokens`` without generating.
``target`` is a ``Server``, a ``Model`` or a ``ServedModel``, as for the OpenAI functions.

``usage`` follows Anthropic's accounting: ``cache_read_input_tokens`` is the prompt prefix
reused from the KV cache (any tier); ``cache_creation_input_tokens`` the prompt tokens this
request computed and wrote to the prompt cache as part of a prefix its ``cache_control``
breakpoints pinned (0 when those prefixes were cached already, or without breakpoints:
caching is otherwise automatic and costs nothing extra); ``input_tokens`` the rest. The three
sum to the prompt, what ``count_tokens`` reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..openai_api.bridge import Observer, arun_plan, run_plan
from ..openai_api.chat import Target, aready, ready
from ..server import Completion
from .blocks import BlockBuilder
from .prompt import MessagesPlan, prepare_messages


def stop_reason(engine_reason: str, stop_word: str, tool_use: bool) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` for an engine finish reason."""
    if engine_reason == "stop" and stop_word:
        return "stop_sequence", stop_word
    if engine_reason in ("max_tokens", "prefill"):
        return "max_tokens", None
    return ("tool_use" if tool_use else "end_turn"), None


def usage_dict(prompt_tokens: int, cached_tokens: int, output_tokens: int,
               created_tokens: int = 0) -> dict[str, Any]:
    """Anthropic ``usage`` (see the module docstring)."""
    return {"input_tokens": prompt_tokens - cached_tokens - created_tokens,
            "cache_creation_input_tokens": created_tokens,
            "cache_read_input_tokens": cached_tokens,
            "output_tokens": output_tokens}


def envelope(plan: MessagesPlan) -> dict[str, Any]:
    """The fields every message object has."""
    return {"id": plan.id, "type": "message", "role": "assistant", "model": plan.model_name}


def build_blocks(plan: MessagesPlan, text: str, *, truncated: bool = False) -> BlockBuilder:
    """The content blocks of a whole output (``truncated``: its token budget ran out)."""
    parser = plan.chat.parser()
    builder = BlockBuilder()
    builder.add(parser.feed(text))
    builder.add(parser.flush(truncated=truncated))
    builder.finish()
    return builder


def message_response(plan: MessagesPlan, completion: Completion) -> dict[str, Any]:
    """The ``message`` object of a finished generation."""
    builder = build_blocks(plan, completion.text,
                           truncated=completion.finish_reason == "max_tokens")
    reason, sequence = stop_reason(completion.finish_reason, completion.stop_word,
                                   builder.has_tool_use)
    usage = completion.usage
    return {**envelope(plan), "content": builder.blocks, "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage_dict(usage.prompt_tokens, usage.cached_tokens,
                                usage.completion_tokens, completion.timings.pinned_tokens)}


def create_message(target: Target, request: Mapping[str, Any], *,
                   observe: Observer | None = None) -> dict[str, Any]:
    """A ``message`` for an Anthropic Messages request (``stream`` is ignored); ``observe``
    receives the request's ``timings``."""
    plan = prepare_messages(ready(target), request)
    return message_response(plan, run_plan(plan.chat, observe))


async def acreate_message(target: Target, request: Mapping[str, Any], *,
                          observe: Observer | None = None) -> dict[str, Any]:
    """Async :func:`create_message`; cancelling the task cancels the request."""
    plan = await asyncio.to_thread(prepare_messages, await aready(target), request)
    return message_response(plan, await arun_plan(plan.chat, observe))


def count_message_tokens(target: Target, request: Mapping[str, Any]) -> dict[str, Any]:
    """``{"input_tokens": N}``: the prompt tokens of a Messages request, nothing generated."""
    plan = prepare_messages(ready(target), request, generate=False)
    return {"input_tokens": len(plan.chat.token_ids)}
