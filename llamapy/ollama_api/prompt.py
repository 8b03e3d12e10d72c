"""From an Ollama ``/api/chat`` or ``/api/generate`` request to an :class:`OllamaPlan`.

The request is translated into a :class:`~llamapy.openai_api.chat_request.ChatRequest` (no
API's shape) and prepared by :func:`~llamapy.openai_api.prompt.prepare_request`, so the chat
template, tool instructions, output
parser (reasoning and tool calls), JSON-schema grammar, request options, tenants and prefix
reuse are those of ``/v1/chat/completions``:

- messages keep their roles; an assistant's ``thinking`` becomes ``reasoning_content`` and its
  ``tool_calls`` (``arguments`` an object) OpenAI calls with ids; a ``tool`` message answers
  the earliest unanswered call (of its ``tool_name`` when given). History the template cannot
  show is inlined (:func:`~llamapy.openai_api.bridge.polyfill_history`). ``images``
  (base64) go before the text of their user turn, for a model with a projector.
- ``format`` ``"json"`` is any JSON (``json_object``), an object is a JSON schema
  (``json_schema``); ``think`` sets the template's ``enable_thinking`` (``"low"``/``"medium"``/
  ``"high"`` mean true); reasoning is always parsed out of the answer into ``thinking``.
- ``/api/generate`` renders ``system`` and ``prompt`` as a conversation, or with ``raw`` sends
  ``prompt`` as it is. Its final object's ``context`` holds the tokens of the prompt and the
  answer; sent back as ``context``, they go before the next prompt's tokens as they are (so
  their KV is reused; a ``raw`` request ignores it, as Ollama does). ``template`` (a Go
  template), ``suffix`` and the image-generation fields are refused, clearly, when set.
- ``logprobs`` / ``top_logprobs`` ask for each token's log-probability and alternatives (as
  ``/v1/chat/completions`` reports them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..chat.layer import ChatOutput
from ..errors import InvalidOptionError, UnsupportedFeatureError
from ..openai_api.bridge import polyfill_history
from ..openai_api.chat_request import ChatRequest
from ..openai_api.completions import check_token_ids
from ..openai_api.params import ResponseFormat, Tool, parse_body
from ..openai_api.prompt import prepare_request
from ..openai_api.target import ServedModel
from ..server import GenerationIntent
from .options import check_num_ctx, engine_options, served_name, token_budget
from .params import ChatBody, GenerateBody, GenerationBody, Message, Options

Kind = Literal["chat", "generate"]


@dataclass(slots=True, kw_only=True)
class OllamaPlan:
    """A request ready to run: prompt tokens, typed engine options, how to parse the output."""

    served: ServedModel
    kind: Kind
    model: str
    token_ids: Sequence[int]
    intent: GenerationIntent
    parser: Callable[[], ChatOutput]
    #: Alternatives reported per token with ``logprobs`` (None: no logprobs).
    top_logprobs: int | None = None
    #: Whether the final object carries ``context`` (``/api/generate`` without ``raw``).
    returns_context: bool = False
    started_ns: int = field(default_factory=time.perf_counter_ns)


def _with_images(content: str, images: list[str] | None) -> str | list[dict[str, Any]]:
    """A user turn's content: its text, or its images (base64, as Ollama sends them) as
    ``image_url`` parts before the text, where Ollama's templates put them."""
    if not images:
        return content
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": f"data:application/octet-stream;base64,"
                                                   f"{image if isinstance(image, str) else ''}"}}
        for image in images]
    return [*parts, {"type": "text", "text": content}]


def _assistant(message: Message, index: int, pending: list[tuple[str, str]]
               ) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.thinking:
        out["reasoning_content"] = message.thinking
    calls = []
    for j, call in enumerate(message.tool_calls or []):
        call_id = call.id or f"call_{index}_{j}"
        pending.append((call_id, call.function.name))
        calls.append({"id": call_id, "type": "function", "function": {
            "name": call.function.name,
            "arguments": json.dumps(call.function.arguments, ensure_ascii=False)}})
    if calls:
        out["tool_calls"] = calls
    return out


def _tool_result(message: Message, pending: list[tuple[str, str]]) -> dict[str, Any]:
    match = next((p for p in pending if message.tool_name in (None, p[1])), None)
    if match is not None:
        pending.remove(match)
    call_id = message.tool_call_id or (match[0] if match else "")
    out: dict[str, Any] = {"role": "tool", "content": message.content or "",
                           "tool_call_id": call_id}
    if message.tool_name:
        out["name"] = message.tool_name
    return out


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Ollama ``messages`` as OpenAI chat messages (before polyfilling)."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        if message.images and message.role != "user":
            raise InvalidOptionError(f"messages[{i}].images: only a user message may hold "
                                     "images", option="images")
        if message.role == "assistant":
            out.append(_assistant(message, i, pending))
        elif message.role == "tool":
            out.append(_tool_result(message, pending))
        else:
            out.append({"role": message.role,
                        "content": _with_images(message.content or "", message.images)})
    return out


def _response_format(body: GenerationBody) -> ResponseFormat | None:
    if body.format in (None, ""):
        return None
    if body.format == "json":
        return parse_body(ResponseFormat, {"type": "json_object"})
    return parse_body(ResponseFormat, {"type": "json_schema", "json_schema": {
        "name": "format", "schema": body.format}})


def _tools(tools: list[dict[str, Any]] | None) -> tuple[dict[str, Any], ...]:
    """``tools``, each checked as a function tool (the shape Ollama shares with OpenAI)."""
    out = []
    for i, tool in enumerate(tools or ()):
        try:
            out.append(parse_body(Tool, tool).model_dump(exclude_none=True))
        except InvalidOptionError as exc:
            raise InvalidOptionError(f"tools[{i}]: {exc}", option="tools") from None
    return tuple(out)


def _request(served: ServedModel, body: GenerationBody, messages: list[dict[str, Any]],
             tools: list[dict[str, Any]] | None = None) -> ChatRequest:
    """The :class:`~llamapy.openai_api.chat_request.ChatRequest` of an Ollama body (its
    budget is set once the prompt is known, :func:`_plan`)."""
    extras = {} if body.think is None else {
        "chat_template_kwargs": {"enable_thinking": body.think is not False}}
    return ChatRequest(
        messages=tuple(polyfill_history(served.chat_templates().source, messages)),
        tools=_tools(tools), response_format=_response_format(body),
        fields=engine_options(body.options), extras=extras,
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else None)


def _plan(served: ServedModel, body: GenerationBody, kind: Kind, request: ChatRequest,
          raw_prompt: str | None = None, context: Sequence[int] = ()) -> OllamaPlan:
    served_name(served, body.model)
    options: Options | None = body.options
    check_num_ctx(options, served.n_ctx_seq())
    chat = prepare_request(served, request)  # (the name was checked: Ollama's spellings)
    token_ids, parser = chat.token_ids, chat.parser
    if raw_prompt is not None:
        token_ids = served.tokenize_prompt(raw_prompt)
        parser = lambda: served.output_parser(  # noqa: E731
            reasoning=body.think is True, prompt_tail=raw_prompt[-64:])
    if context:
        token_ids = _after_context(served, context, token_ids)
    n = len(token_ids)
    budget = token_budget(options.num_predict if options else None, n, served.n_ctx_seq(),
                          served.default_max_tokens(n))
    return OllamaPlan(served=served, kind=kind, model=body.model, token_ids=token_ids,
                      intent=served.revise(chat.intent, max_tokens=budget), parser=parser,
                      top_logprobs=chat.top_logprobs)


def prepare_chat_request(served: ServedModel, request: Mapping[str, Any] | ChatBody
                         ) -> OllamaPlan:
    """Validate an ``/api/chat`` request and prepare it (no generation yet)."""
    body = request if isinstance(request, ChatBody) else parse_body(ChatBody, request)
    return _plan(served, body, "chat",
                 _request(served, body, chat_messages(body.messages or []), body.tools))


def prepare_generate(served: ServedModel, request: Mapping[str, Any] | GenerateBody
                     ) -> OllamaPlan:
    """Validate an ``/api/generate`` request and prepare it (no generation yet)."""
    body = request if isinstance(request, GenerateBody) else parse_body(GenerateBody, request)
    if body.images and body.raw:
        raise UnsupportedFeatureError("images", "images with raw are not supported: the "
                                      "template places them")
    refused = {"template": body.template, "suffix": body.suffix,
               "width": body.width, "height": body.height, "steps": body.steps}
    for name, value in refused.items():
        if value:
            raise UnsupportedFeatureError(name, f"{name} is not supported on /api/generate "
                                                "here")
    prompt = body.prompt or ""
    messages: list[dict[str, Any]] = [{"role": "user",
                                       "content": _with_images(prompt, body.images)}]
    if body.system:
        messages.insert(0, {"role": "system", "content": body.system})
    context = [] if body.raw or not body.context else check_token_ids(
        served, body.context, "context")
    if context and body.images:
        raise UnsupportedFeatureError("context", "context with images is not supported")
    plan = _plan(served, body, "generate", _request(served, body, messages),
                 prompt if body.raw else None, context)
    plan.returns_context = not body.raw
    return plan


def _after_context(served: ServedModel, context: Sequence[int], token_ids: Sequence[int]
                   ) -> list[int]:
    """An earlier answer's ``context`` tokens, then the prompt's (a leading BOS of the prompt
    dropped: it already opens the context)."""
    new = list(token_ids)
    if new and served.model.add_bos and new[0] == served.model.bos:
        new = new[1:]
    return [*context, *new]
