"""What the APIs built on chat share: the Anthropic Messages API and the OpenAI Responses API
are translated into an OpenAI chat request and run through :func:`~.prompt.prepare_chat`.

So they use the same chat template, request options, output parser, forced-call grammar and
``Server`` request path as ``/v1/chat/completions``; this module holds the pieces both need:

- :func:`forward_extras`: a body's non-API fields are passed on only when they are engine
  request options (``min_p``, ``seed``, ``grammar``, ``cache_scope``, ...) or llamapy's API
  extras; any other unknown field is a 400 naming it.
- :func:`polyfill_history`: a history the template cannot show is shown anyway. Templates that
  never mention ``reasoning_content`` get earlier reasoning inlined as ``<think>...</think>``
  before the answer; templates that never mention ``tool_calls`` get earlier calls inlined in
  the Hermes framing the tool instructions teach (``<tool_call>{...}</tool_call>``) and tool
  results as a user turn of ``<tool_response>...</tool_response>`` blocks. Without this a small
  template (SmolLM2's renders only ``role`` and ``content``) would drop them silently.
- :func:`run_plan` / :func:`arun_plan` / :func:`plan_events` / :func:`aplan_events`: one
  generation of a :class:`~.prompt.ChatPlan`, whole or as converted stream events.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping
from contextlib import aclosing, closing
from typing import Any

from ..chat import REASONING_PROTOCOLS
from ..engine import DoneEvent, StreamEvent
from ..errors import UnknownOptionError
from ..server import Completion, server_request_option_keys
from .params import (
    API_EXTRAS,
    ENGINE_ALIASES,
    GenerationBody,
    engine_extras,
    parse_body,
    sampling_options,
)
from .prompt import ChatPlan
from .report import timings_dict

#: Converts one engine event into API stream events.
Converter = Callable[[StreamEvent], list[dict[str, Any]]]
#: Receives a finished request's ``timings`` (llama-server's keys, see :mod:`.report`).
Observer = Callable[[Mapping[str, Any]], None]

THINK_OPEN, THINK_CLOSE = REASONING_PROTOCOLS["think"]


def api_id(prefix: str) -> str:
    """An object id in the ``prefix_hex`` style of both APIs (``msg_...``, ``resp_...``)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def forward_extras(extra: Mapping[str, Any], *, fields: Iterable[str],
                   owned: Iterable[str] = ()) -> dict[str, Any]:
    """The extra fields of a body that may pass to the chat request.

    ``fields`` are the API's own field names (listed as valid in the error); ``owned`` names
    engine options the translation sets itself from the API's own fields (``stop``), which a
    body may not set twice.
    """
    allowed = ((set(server_request_option_keys()) | set(ENGINE_ALIASES) | set(API_EXTRAS))
               - set(owned))
    unknown = [key for key in extra if key not in allowed]
    if unknown:
        raise UnknownOptionError(unknown, set(fields) | allowed, where="request")
    return dict(extra)


#: OpenAI's own sampling fields: as a translated body's extras they get OpenAI's checks.
OPENAI_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty",
                   "stop", "logit_bias")


def extra_fields(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The engine fields among a translated body's extras (:func:`forward_extras`), checked as
    ``/v1/chat/completions`` checks them: OpenAI's sampling fields with OpenAI's types and
    bounds (``presence_penalty`` within -2..2, ...), the others as engine options."""
    openai = {key: extra[key] for key in OPENAI_SAMPLING if key in extra}
    fields = engine_extras({k: v for k, v in extra.items() if k not in OPENAI_SAMPLING})
    fields.update(sampling_options(parse_body(GenerationBody, openai)))
    return fields


# --- history the template cannot show ---------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content
                         if isinstance(part, Mapping))
    return "" if content is None else str(content)


def _inline_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = message.get("reasoning_content")
    if message.get("role") != "assistant" or not reasoning:
        return message
    out = {key: value for key, value in message.items() if key != "reasoning_content"}
    out["content"] = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{_text(message.get('content'))}"
    return out


def hermes_call(name: str, arguments: str) -> str:
    """One call in the Hermes framing (arguments JSON text, an object when it parses)."""
    try:
        value: Any = json.loads(arguments) if arguments else {}
    except ValueError:
        value = arguments
    call = json.dumps({"name": name, "arguments": value}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def _inline_calls(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls") or []
    texts = [hermes_call(call["function"]["name"], call["function"]["arguments"])
             for call in calls]
    out = {key: value for key, value in message.items() if key != "tool_calls"}
    text = _text(message.get("content"))
    out["content"] = text + ("" if not text or text.endswith("\n") else "\n") + "\n".join(texts)
    return out


def _inline_tools(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "tool":
            block = f"<tool_response>\n{_text(message.get('content'))}\n</tool_response>"
            if out and out[-1].get("tool_responses"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_responses": True})
        elif message.get("tool_calls"):
            out.append(_inline_calls(message))
        else:
            out.append(message)
    return [{k: v for k, v in m.items() if k != "tool_responses"} for m in out]


def polyfill_history(template_source: str, messages: list[dict[str, Any]]
                     ) -> list[dict[str, Any]]:
    """``messages`` (OpenAI chat shape) as a template with ``template_source`` can show them."""
    out = messages
    if "reasoning_content" not in template_source:
        out = [_inline_reasoning(message) for message in out]
    if "tool_calls" not in template_source:
        out = _inline_tools(out)
    return out


# --- generation ---------------------------------------------------------------------------------


def _observe(plan: ChatPlan, observe: Observer | None, event: DoneEvent | Completion) -> None:
    if observe is not None:
        observe(timings_dict(event.timings, plan.served.model, plan.token_ids))


def run_plan(plan: ChatPlan, observe: Observer | None = None) -> Completion:
    """Generate the whole answer of ``plan``."""
    completion = plan.served.complete(plan.token_ids, plan.intent)
    _observe(plan, observe, completion)
    return completion


async def arun_plan(plan: ChatPlan, observe: Observer | None = None) -> Completion:
    """Async :func:`run_plan`; cancelling the task cancels the request."""
    completion = await plan.served.acomplete(plan.token_ids, plan.intent)
    _observe(plan, observe, completion)
    return completion


def plan_events(plan: ChatPlan, convert: Converter, observe: Observer | None = None
                ) -> Iterator[dict[str, Any]]:
    """The API stream events ``convert`` makes of ``plan``'s engine events (closing cancels)."""
    with closing(plan.served.events(plan.token_ids, plan.intent)) as events:
        for event in events:
            if isinstance(event, DoneEvent):
                _observe(plan, observe, event)
            yield from convert(event)


async def aplan_events(plan: ChatPlan, convert: Converter, observe: Observer | None = None
                       ) -> AsyncGenerator[dict[str, Any], None]:
    """Async :func:`plan_events`."""
    async with aclosing(plan.served.aevents(plan.token_ids, plan.intent)) as events:
        async for event in events:
            if isinstance(event, DoneEvent):
                _observe(plan, observe, event)
            for item in convert(event):
                yield item
