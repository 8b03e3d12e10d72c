"""OpenAI's ``POST /v1/responses/compact``: a conversation replaced by a summary of it.

Codex calls it when its history grows long and continues from the ``output`` it returns: the
input's user messages, then one ``compaction`` item. Later turns send that item back as input,
where it reads as a user message, "Summary of the conversation so far:" and the summary
(:mod:`.responses_input`), the same text every time.

The summary is written by the served model, once and greedily, on the prompt the next
``/v1/responses`` turn renders: the body's ``instructions``, its ``tools`` (offered as that
turn offers them, so their section renders alike), ``reasoning`` and the history, then one more
user message, :data:`SUMMARY_INSTRUCTION`. The history's KV is already cached by the turns that
made it (``usage.input_tokens_details.cached_tokens``), and ``prompt_cache_key`` routes the
request to the slot holding it. The budget is :data:`SUMMARY_TOKENS`, at most a quarter of the
context (and within the server's ``n_predict`` and the rest of the context). A model that
answers with a tool call and no text is asked once more with no tools offered (that prompt
renders without them: no reuse); ``usage`` counts both runs. The summary is the answer's text
(its reasoning when it wrote none).

``encrypted_content`` is :data:`~.responses_params.COMPACTION_PREFIX` and the base64url JSON
``{"summary": ...}``: readable, the tenant's own text, not encrypted.

``previous_response_id`` is refused here: the HTTP route replaces it with the stored
conversation first (:func:`~.responses_state.continue_request`). ``text``, ``service_tier``,
``safety_identifier``, ``prompt_cache_options`` and ``image`` (sent by Codex or the official
client) are accepted and change nothing (the summary is plain text). Any other field must be an
engine request option or a llamapy API extra (:func:`~.bridge.forward_extras`), as on
``/v1/responses``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..errors import InvalidOptionError, UnsupportedFeatureError
from ..server import Completion, Usage
from .bridge import Observer, api_id, arun_plan, forward_extras, run_plan
from .chat import Target, aready, ready
from .params import parse_body
from .prompt import prepare_request
from .responses_input import OWNED_OPTIONS, ResponsesPlan, chat_request
from .responses_output import output_items, reasoning_tokens, response_status, usage_dict
from .responses_params import (
    ImagePart,
    MessageItem,
    ReasoningConfig,
    RefusalPart,
    ResponsesBody,
    TextConfig,
    compaction_content,
    parse_item,
    parse_part,
)
from .target import ServedModel

__all__ = ["SUMMARY_INSTRUCTION", "SUMMARY_TOKENS", "CompactBody", "acompact_response",
           "compact_response", "conversation"]

#: Most tokens the summary may take (and at most a quarter of the context).
SUMMARY_TOKENS = 1024

#: The last user message of the summarising run: what a coding agent needs to go on.
SUMMARY_INSTRUCTION = (
    "Stop working on the task for a moment: this conversation is about to be replaced by "
    "your summary of it, and the work will continue from that summary alone. Do not call any "
    "tools. Write the summary now, in plain text, under these headings:\n\n"
    "Goal: what the user asked for and why; every requirement, constraint and preference "
    "they stated, in their words where it matters.\n"
    "Decisions: what was decided, chosen or ruled out, and the reasons.\n"
    "Files: every file read, created, changed or deleted, by exact path, with what was done "
    "to it and why.\n"
    "State: what is done and checked, what is in progress, what fails (the exact commands, "
    "error messages and test names), and what was learned about the code and the "
    "environment.\n"
    "Next steps: what remains, in order, starting with the very next action.\n\n"
    "Keep names, paths, commands, identifiers and numbers exact. Leave out greetings and "
    "whatever is settled and no longer matters. Answer with the summary only.")


class CompactBody(BaseModel):
    """``POST /v1/responses/compact`` (see the module for what each field does)."""

    model_config = ConfigDict(defer_build=True, extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "in-memory", "24h"] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    image: dict[str, Any] | None = None
    previous_response_id: str | None = None


#: The compact request's own field names.
COMPACT_FIELDS = tuple(CompactBody.model_fields)


def conversation(body: CompactBody) -> list[dict[str, Any]]:
    """The conversation to compact as input items (a string ``input``: one user message)."""
    if body.previous_response_id:
        raise UnsupportedFeatureError(
            "previous_response_id", "previous_response_id: responses are not stored; send "
            "the whole conversation in 'input'")
    if not body.input:
        raise InvalidOptionError("input: there is no conversation to compact", option="input")
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    return list(body.input)


def summary_request(body: CompactBody, history: Sequence[Mapping[str, Any]], *, tools: bool
                    ) -> ResponsesBody:
    """The Responses request writing the summary: the next turn's prompt plus
    :data:`SUMMARY_INSTRUCTION`, greedy (``tools`` false: none offered)."""
    extra = forward_extras(body.model_extra or {}, fields=COMPACT_FIELDS, owned=OWNED_OPTIONS)
    own = {"model": body.model, "instructions": body.instructions,
           "input": [*history, {"role": "user", "content": SUMMARY_INSTRUCTION}],
           "tools": body.tools, "tool_choice": "auto" if tools else "none",
           "parallel_tool_calls": body.parallel_tool_calls, "reasoning": body.reasoning,
           "temperature": 0.0, "prompt_cache_key": body.prompt_cache_key,
           "prompt_cache_retention": body.prompt_cache_retention}
    return ResponsesBody.model_construct(**{**extra, **own})


def summary_plan(served: ServedModel, body: CompactBody, history: Sequence[Mapping[str, Any]],
                 *, tools: bool) -> ResponsesPlan:
    """The summarising run, its budget capped at :data:`SUMMARY_TOKENS` and a quarter of the
    context (the default budget, the rest of the context, may be smaller)."""
    request = summary_request(body, history, tools=tools)
    plan = ResponsesPlan(chat=prepare_request(served, chat_request(served, request)),
                         body=request)
    cap = min(SUMMARY_TOKENS, max(1, served.n_ctx_seq() // 4))
    if plan.chat.intent.options.max_tokens <= cap:
        return plan
    return replace(plan, chat=replace(
        plan.chat, intent=served.revise(plan.chat.intent, max_tokens=cap)))


def _first_plan(served: ServedModel, request: Mapping[str, Any]
                ) -> tuple[CompactBody, list[dict[str, Any]], ResponsesPlan]:
    body = parse_body(CompactBody, request)
    history = conversation(body)
    return body, history, summary_plan(served, body, history, tools=True)


def _items(plan: ResponsesPlan, completion: Completion) -> list[dict[str, Any]]:
    return output_items(plan, completion.text, response_status(completion.finish_reason))


def _text(items: list[dict[str, Any]], kind: str) -> str:
    return "".join(part["text"] for item in items if item["type"] == kind
                   for part in item["content"]).strip()


def called_instead(plan: ResponsesPlan, completion: Completion) -> bool:
    """Whether the model answered the instruction with a tool call and no text."""
    items = _items(plan, completion)
    return (plan.chat.tools_active and not _text(items, "message")
            and any(item["type"] == "function_call" for item in items))


def _input_parts(content: str | list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    parts: list[dict[str, Any]] = []
    for j, raw in enumerate(content):
        part = parse_part(raw, f"{where}[{j}]")
        if isinstance(part, ImagePart):
            parts.append(part.model_dump(exclude_none=True))
        else:
            text = part.refusal if isinstance(part, RefusalPart) else part.text
            parts.append({"type": "input_text", "text": text})
    return parts


def user_messages(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The user messages of ``history`` as message items (``input_text``/``input_image``)."""
    out = []
    for i, raw in enumerate(history):
        item = parse_item(raw, f"input[{i}]")
        if isinstance(item, MessageItem) and item.role == "user":
            out.append({"id": api_id("msg"), "type": "message", "role": "user",
                        "status": "completed",
                        "content": _input_parts(item.content, f"input[{i}].content")})
    return out


def compaction_item(summary: str) -> dict[str, Any]:
    """The ``compaction`` output item carrying ``summary``."""
    return {"id": api_id("cmp"), "type": "compaction",
            "encrypted_content": compaction_content(summary)}


def compacted(plan: ResponsesPlan, history: Sequence[Mapping[str, Any]],
              completions: Sequence[Completion]) -> dict[str, Any]:
    """The ``response.compaction`` object: the user messages, then the summary of the last
    run (its text, else its reasoning, else its raw output); ``usage`` counts every run."""
    last = completions[-1]
    items = _items(plan, last)
    summary = _text(items, "message") or _text(items, "reasoning") or last.text.strip()
    usage = Usage(sum(c.usage.prompt_tokens for c in completions),
                  sum(c.usage.completion_tokens for c in completions),
                  sum(c.usage.cached_tokens for c in completions))
    return {"id": plan.id, "object": "response.compaction", "created_at": plan.created_at,
            "output": [*user_messages(history), compaction_item(summary)],
            "usage": usage_dict(usage, reasoning_tokens(plan, items))}


# --- library functions ------------------------------------------------------------------------


def compact_response(target: Target, request: Mapping[str, Any], *,
                     observe: Observer | None = None) -> dict[str, Any]:
    """A ``response.compaction`` for a compact request; ``observe`` receives each run's
    ``timings``."""
    served = ready(target)
    body, history, plan = _first_plan(served, request)
    completions = [run_plan(plan.chat, observe)]
    if called_instead(plan, completions[0]):
        plan = summary_plan(served, body, history, tools=False)
        completions.append(run_plan(plan.chat, observe))
    return compacted(plan, history, completions)


async def acompact_response(target: Target, request: Mapping[str, Any], *,
                            observe: Observer | None = None) -> dict[str, Any]:
    """Async :func:`compact_response` (rendering and parsing off the event loop); cancelling
    the task cancels the request."""
    served = await aready(target)
    body, history, plan = await asyncio.to_thread(_first_plan, served, request)
    completions = [await arun_plan(plan.chat, observe)]
    if await asyncio.to_thread(called_instead, plan, completions[0]):
        plan = await asyncio.to_thread(summary_plan, served, body, history, tools=False)
        completions.append(await arun_plan(plan.chat, observe))
    return await asyncio.to_thread(compacted, plan, history, completions)
