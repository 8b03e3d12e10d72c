"""Output items of a Responses answer, built from the output parser's deltas, and the
``response`` object around them.

:class:`ItemBuilder` is the one place that decides the items: a stream sends the events its
:meth:`~ItemBuilder.add` returns, a whole response uses :attr:`~ItemBuilder.items` after
feeding it the whole output, so both agree. Items open one at a time with increasing
``output_index``: ``reasoning`` (one ``reasoning_text`` part), ``message`` (one
``output_text`` part) and one ``function_call`` per call; a new kind of output closes the
open item. With ``include: ["reasoning.encrypted_content"]`` a reasoning item carries its
text as ``encrypted_content`` (opaque to the client; this server reads it back as reasoning).
"""

from __future__ import annotations

import copy
from typing import Any

from ..chat import Delta, ToolCallDelta
from ..server import Usage
from .bridge import api_id
from .responses_input import ResponsesPlan
from .responses_params import ResponsesBody
from .responses_tools import Namespaces

#: Events by item type: (content part type, delta event, done event).
_TEXT_EVENTS = {
    "reasoning": ("reasoning_text", "response.reasoning_text.delta",
                  "response.reasoning_text.done"),
    "message": ("output_text", "response.output_text.delta", "response.output_text.done"),
}
#: Item id prefixes by item type.
_ID_PREFIXES = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


def _new_item(kind: str, **fields: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"id": api_id(_ID_PREFIXES[kind]), "type": kind,
                            "status": "in_progress"}
    if kind == "message":
        item.update(role="assistant", content=[])
    elif kind == "reasoning":
        item.update(summary=[], content=[])
    item.update(fields)
    return item


def _part(kind: str) -> dict[str, Any]:
    if kind == "message":
        return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": ""}


class ItemBuilder:
    """Turns parser deltas into output items and the stream events that build them."""

    def __init__(self, *, encrypt_reasoning: bool = False,
                 namespaces: Namespaces | None = None) -> None:
        self.items: list[dict[str, Any]] = []
        self.encrypt_reasoning = encrypt_reasoning
        self.namespaces = namespaces or Namespaces()
        self._open = False

    @property
    def _index(self) -> int:
        return len(self.items) - 1

    def _where(self, **more: Any) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": self._index, **more}

    def _start(self, item: dict[str, Any], status: str = "completed") -> list[dict[str, Any]]:
        events = self.finish(status)
        self.items.append(item)
        self._open = True
        events.append({"type": "response.output_item.added", "output_index": self._index,
                       "item": copy.deepcopy(item)})
        if item["type"] in _TEXT_EVENTS:
            item["content"].append(_part(item["type"]))
            events.append({"type": "response.content_part.added",
                           **self._where(content_index=0, part=_part(item["type"]))})
        return events

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if not (self._open and self.items[-1]["type"] == kind):
            events = self._start(_new_item(kind))
        self.items[-1]["content"][0]["text"] += text
        delta = {"type": _TEXT_EVENTS[kind][1], **self._where(content_index=0, delta=text)}
        if kind == "message":
            delta["logprobs"] = []
        return [*events, delta]

    def _call(self, piece: ToolCallDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if piece.id is not None:
            name, namespace = self.namespaces.split(piece.name or "")
            events = self._start(_new_item("function_call", call_id=piece.id, name=name,
                                           arguments="", **({"namespace": namespace}
                                                            if namespace else {})))
        if piece.arguments and self._open and self.items[-1]["type"] == "function_call":
            self.items[-1]["arguments"] += piece.arguments
            events.append({"type": "response.function_call_arguments.delta",
                           **self._where(delta=piece.arguments)})
        return events

    def add(self, delta: Delta) -> list[dict[str, Any]]:
        """Account for one parser delta; return the stream events it makes."""
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            events += self._text("reasoning", delta.reasoning)
        if delta.content:
            events += self._text("message", delta.content)
        for piece in delta.tool_call_deltas:
            events += self._call(piece)
        return events

    def _done_events(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        if item["type"] == "function_call":
            return [{"type": "response.function_call_arguments.done",
                     **self._where(arguments=item["arguments"], name=item["name"])}]
        part = item["content"][0]
        done = {"type": _TEXT_EVENTS[item["type"]][2],
                **self._where(content_index=0, text=part["text"])}
        if item["type"] == "message":
            done["logprobs"] = []
        return [done, {"type": "response.content_part.done",
                       **self._where(content_index=0, part=copy.deepcopy(part))}]

    def finish(self, status: str = "completed") -> list[dict[str, Any]]:
        """Close the open item with ``status`` (``completed`` or ``incomplete``)."""
        if not self._open:
            return []
        self._open = False
        item = self.items[-1]
        item["status"] = status
        if item["type"] == "reasoning" and self.encrypt_reasoning:
            item["encrypted_content"] = item["content"][0]["text"]
        return [*self._done_events(item),
                {"type": "response.output_item.done", "output_index": self._index,
                 "item": copy.deepcopy(item)}]


def output_items(plan: ResponsesPlan, text: str, status: str) -> list[dict[str, Any]]:
    """The output items of a whole output."""
    parser = plan.chat.parser()
    builder = ItemBuilder(encrypt_reasoning=plan.encrypt_reasoning,
                          namespaces=plan.namespaces)
    builder.add(parser.feed(text))
    builder.add(parser.flush(truncated=status == "incomplete"))
    builder.finish(status)
    return builder.items


def response_status(engine_reason: str) -> str:
    """``completed``, or ``incomplete`` when the token budget (or the context) ran out."""
    return "incomplete" if engine_reason in ("max_tokens", "prefill") else "completed"


def usage_dict(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    """Responses ``usage`` (``cached_tokens``: the reused prompt prefix)."""
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": usage.total_tokens}


def reasoning_tokens(plan: ResponsesPlan, items: list[dict[str, Any]]) -> int:
    """Tokens of the reasoning text in ``items`` (the markers around it not counted)."""
    texts = [item["content"][0]["text"] for item in items if item["type"] == "reasoning"]
    model = plan.chat.served.model
    return sum(len(model.tokenize(text, False, False)) for text in texts if text)


def _echo(body: ResponsesBody) -> dict[str, Any]:
    fmt = body.text.format if body.text and body.text.format else None
    reasoning = body.reasoning
    return {
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {}, "parallel_tool_calls": body.parallel_tool_calls
        is not False, "previous_response_id": None,
        "reasoning": {"effort": reasoning.effort if reasoning else None,
                      "summary": reasoning.summary if reasoning else None},
        "store": bool(body.store), "temperature": body.temperature, "top_p": body.top_p,
        "text": {"format": fmt.model_dump(exclude_none=True, by_alias=True) if fmt
                 else {"type": "text"}},
        "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
        "truncation": "disabled", "user": body.user,
    }


def response_object(plan: ResponsesPlan, *, status: str, output: list[dict[str, Any]],
                    usage: dict[str, Any] | None) -> dict[str, Any]:
    """The ``response`` object (``status`` ``in_progress`` while streaming)."""
    return response_fields(plan.body, id=plan.id, created_at=plan.created_at,
                           model=plan.model_name, status=status, output=output, usage=usage)


def response_fields(body: ResponsesBody, *, id: str, created_at: int, model: str, status: str,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None
                    ) -> dict[str, Any]:
    """A ``response`` object answering ``body``."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": id, "object": "response", "created_at": created_at,
        "status": status, "model": model, "output": output, "error": None,
        "incomplete_details": incomplete, "usage": usage, **_echo(body),
    }
