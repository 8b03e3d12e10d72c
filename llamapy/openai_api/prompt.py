"""From a chat request to a prompt: messages through the chat template, tools, grammar.

:func:`prepare_request` takes a chat request of any API (a
:class:`~.chat_request.ChatRequest`; :func:`prepare_chat` makes one from an OpenAI body),
renders the conversation with the model's chat template (tool instructions added to the
system message when the template does not present ``tools`` itself), picks the grammar
(forced tool call, ``response_format``, raw ``grammar``) and resolves the engine options once,
into a typed :class:`~llamapy.server.GenerationIntent`. It does everything but generate, so
the sync, async, streaming and non-streaming paths share it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..chat import OutputParser
from ..chat.tool_prompt import tool_instructions
from ..errors import InvalidOptionError
from ..grammar.json_schema import json_object_grammar, schema_to_gbnf
from ..grammar.tool_calls import offered_grammar_or_none, tool_call_grammar
from ..options import check_reasoning_format
from ..server import GenerationIntent
from .chat_request import ChatRequest, from_chat_body
from .logprobs import MIN_CANDIDATES
from .media_parts import take_media
from .params import ChatBody, ResponseFormat, check_unsupported, parse_body
from .target import ServedModel


def new_id(prefix: str) -> str:
    """An OpenAI-style object id (``chatcmpl-...``, ``cmpl-...``)."""
    return f"{prefix}-{secrets.token_hex(12)}"


@dataclass(slots=True)
class ChatPlan:
    """A chat request ready to run: prompt tokens, its typed engine options (``intent``), how
    to parse the output."""

    served: ServedModel
    request: ChatRequest
    prompt: str
    token_ids: Sequence[int]
    intent: GenerationIntent
    tools_active: bool
    reasoning: bool
    reasoning_started: bool
    id: str = field(default_factory=lambda: new_id("chatcmpl"))
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_name(self) -> str:
        """The ``model`` field of responses."""
        return self.served.name

    @property
    def verbose(self) -> bool:
        """Whether responses carry llama-server's ``__verbose`` object (the request's
        ``verbose``, else the server's ``--verbose``)."""
        asked = self.request.extra("verbose")
        if asked is not None and not isinstance(asked, bool):
            raise InvalidOptionError("verbose must be a boolean", option="verbose")
        return self.served.verbose if asked is None else asked

    @property
    def top_logprobs(self) -> int | None:
        """How many alternatives per token to report (None: no logprobs)."""
        return self.request.top_logprobs

    def parser(self) -> OutputParser:
        """A fresh output parser for this request."""
        return self.served.output_parser(tools=self.tools_active, reasoning=self.reasoning,
                                         reasoning_started=self.reasoning_started)


def _with_tool_instructions(messages: list[Mapping[str, Any]], tools: list[Mapping[str, Any]]
                            ) -> list[Mapping[str, Any]]:
    section = tool_instructions(tools)
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        content = first.get("content") or ""
        if isinstance(content, list):
            content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        first["content"] = f"{content}\n\n{section}" if content else section
        return [first, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]


def render_prompt(served: ServedModel, request: ChatRequest) -> str:
    """The rendered prompt text (raises ``TemplateError`` with the template's message)."""
    messages = list(request.messages)
    tools = list(request.tools)
    tools_active = request.tools_active
    if tools_active and not served.template_renders_tools():
        messages = _with_tool_instructions(messages, tools)
    kwargs = request.extra("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise InvalidOptionError("chat_template_kwargs must be an object",
                                 option="chat_template_kwargs")
    variables = {**served.template_kwargs, **kwargs}
    tools_arg = tools if tools_active else None
    if _continues(request, messages, served.prefill_assistant):
        return served.template().render_continuation(messages, tools=tools_arg, **variables)
    add = request.extra("add_generation_prompt", True)
    if not isinstance(add, bool):
        raise InvalidOptionError("add_generation_prompt must be a boolean",
                                 option="add_generation_prompt")
    return served.template().render(messages, tools=tools_arg, add_generation_prompt=add,
                                    **variables)


def _continues(request: ChatRequest, messages: list[Mapping[str, Any]], prefill: bool
               ) -> bool:
    """Whether the model continues the last (assistant) message: ``continue_final_message``
    (``true``, ``"content"``), or llama-server's assistant prefill (on unless the server runs
    with ``--no-prefill-assistant``) when the conversation ends with an assistant message."""
    explicit = request.extra("continue_final_message")
    last = messages[-1] if messages else {}
    if explicit not in (None, False, True, "content", "reasoning_content"):
        raise InvalidOptionError("continue_final_message must be a boolean or \"content\"",
                                 option="continue_final_message")
    wanted = bool(explicit) or (explicit is None and prefill and last.get("role") == "assistant")
    if not wanted:
        return False
    if explicit and request.extra("add_generation_prompt") is True:
        raise InvalidOptionError("Cannot set both add_generation_prompt and "
                                 "continue_final_message to true.", option="add_generation_prompt")
    if last.get("role") != "assistant":
        raise InvalidOptionError("continue_final_message needs a final assistant message",
                                 option="continue_final_message")
    if len(messages) >= 2 and messages[-2].get("role") == "assistant":
        raise InvalidOptionError("Cannot have 2 or more assistant messages at the end of the "
                                 "list.", option="messages")
    if last.get("tool_calls"):
        raise InvalidOptionError("Cannot continue an assistant message that contains tool "
                                 "calls.", option="messages")
    return True


def _tool_grammar(served: ServedModel, request: ChatRequest) -> str | None:
    """The forced-call grammar of ``tool_choice`` ``required`` or a named function."""
    choice = request.tool_choice
    if choice is None or choice in ("auto", "none"):
        return None
    if not request.tools:
        raise InvalidOptionError("tool_choice needs tools", option="tool_choice")
    return tool_call_grammar([dict(tool) for tool in request.tools],
                             choice if isinstance(choice, str) else dict(choice),
                             served.tool_protocol(), parallel=request.parallel_tool_calls)


def _format_grammar(fmt: ResponseFormat | None) -> str | None:
    """The grammar of ``response_format`` ``json_object`` / ``json_schema``."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_schema" and fmt.json_schema is None:
        raise InvalidOptionError("response_format json_schema needs 'json_schema'",
                                 option="response_format.json_schema")
    schema = fmt.json_schema.schema_ if fmt.json_schema is not None else fmt.schema_
    return schema_to_gbnf(schema) if schema is not None else json_object_grammar()


def response_grammar(served: ServedModel, request: ChatRequest) -> str | None:
    """The grammar a request implies: a forced tool call, ``response_format`` or llama.cpp's
    ``json_schema`` field (at most one of them), or None."""
    extra_schema = request.extra("json_schema")
    grammars = [g for g in (
        _tool_grammar(served, request), _format_grammar(request.response_format),
        schema_to_gbnf(extra_schema) if extra_schema is not None else None) if g is not None]
    if len(grammars) > 1:
        raise InvalidOptionError("a forced tool call, response_format and json_schema are "
                                 "exclusive", option="response_format")
    return grammars[0] if grammars else None


def _reasoning(served: ServedModel, request: ChatRequest) -> bool:
    fmt = check_reasoning_format(request.extra("reasoning_format", served.reasoning_format))
    return fmt != "none"


def call_intent(served: ServedModel, ignore_eos: object, fields: Mapping[str, Any],
                budget: int | None, prompt_tokens: int) -> GenerationIntent:
    """The request's typed options: ``fields`` (the body's sampling fields and extras, plus
    what the API derived from its own fields) resolved by :meth:`ServedModel.intent`
    (``budget`` None: the server's default)."""
    return served.intent(fields, ignore_eos=ignore_eos, max_tokens=budget,
                         prompt_tokens=prompt_tokens)


def chat_fields(served: ServedModel, request: ChatRequest, prompt_tokens: int
                ) -> dict[str, Any]:
    """The engine fields of a chat request: its own, the whole prompt pinned for
    ``retention_s`` (OpenAI's ``prompt_cache_retention``), the grammar it implies (a forced
    tool call, ``response_format``; offered tools a lazy one) and enough candidates for
    ``top_logprobs``."""
    fields = dict(request.fields)
    if request.retention_s is not None and "cache_pins" not in fields:
        fields["cache_pins"] = ((prompt_tokens, request.retention_s),)
    grammar = response_grammar(served, request)
    if grammar is not None:
        if fields.get("grammar"):
            raise InvalidOptionError("grammar conflicts with tools/response_format",
                                     option="grammar")
        fields["grammar"] = grammar
    elif request.tools_active and not fields.get("grammar"):
        offered = offered_grammar_or_none([dict(t) for t in request.tools],
                                          served.tool_protocol())
        if offered is not None:
            fields["grammar"], fields["grammar_triggers"] = offered
    if request.top_logprobs is not None:
        fields["n_probs"] = max(fields.get("n_probs", 0), request.top_logprobs, MIN_CANDIDATES)
    return fields


def prepare_chat(served: ServedModel, request: Mapping[str, Any]) -> ChatPlan:
    """Validate an OpenAI chat request and turn it into a :class:`ChatPlan` (no generation
    yet)."""
    body = parse_body(ChatBody, request)
    check_unsupported(body)
    return prepare_request(served, from_chat_body(body))


def prepare_request(served: ServedModel, request: ChatRequest) -> ChatPlan:
    """A chat request of any API (:class:`~.chat_request.ChatRequest`) as a
    :class:`ChatPlan`: the model checked, the prompt rendered and tokenized, the engine
    options resolved."""
    served.check_model(request.model)
    if not request.messages:
        raise InvalidOptionError("the conversation has no message", option="messages")
    served.server.check_fits_at_once(request.n)
    messages, media = take_media(request.messages, served.limits, served.media_fetch)
    if media:
        request = replace(request, messages=messages)
    prompt = render_prompt(served, request)
    token_ids = served.tokenize_prompt(prompt, media)
    fields = chat_fields(served, request, len(token_ids))
    intent = call_intent(served, request.extra("ignore_eos"), fields, request.max_tokens,
                         len(token_ids))
    reasoning = _reasoning(served, request)
    plan = ChatPlan(
        served=served, request=request, prompt=prompt, token_ids=token_ids, intent=intent,
        tools_active=request.tools_active, reasoning=reasoning,
        reasoning_started=reasoning and prompt.rstrip().endswith("<think>"),
    )
    plan.verbose  # noqa: B018 - a bad ``verbose`` is a 400 before generating
    return plan
