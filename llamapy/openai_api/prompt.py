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

from ..chat.layer import ChatOutput
from ..errors import InvalidOptionError
from ..server import GenerationIntent, with_checkpoint_hints
from .chat_request import ChatRequest, from_chat_body
from .logprobs import MIN_CANDIDATES
from .media_parts import take_media
from .params import ChatBody, check_unsupported, parse_body
from .render import Rendered, render
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
    rendered: Rendered
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

    def parser(self) -> ChatOutput:
        """A fresh output parser for this request."""
        rendered = self.rendered
        return ChatOutput(rendered.params, reasoning_format=rendered.reasoning_format,
                          tools=self.tools_active, continuation=rendered.continuation)


def render_prompt(served: ServedModel, request: ChatRequest) -> str:
    """The rendered prompt text (raises ``TemplateError`` with the template's message)."""
    return render_request(served, request).prompt


def _hinted(served: ServedModel, rendered: Rendered, token_ids: Sequence[int]
            ) -> Sequence[int]:
    """``token_ids`` hinting where the generation prompt starts (the next turn renders the
    answer without it, or with another header: a model whose state cannot be trimmed keeps a
    checkpoint there)."""
    header = rendered.params.generation_prompt
    if not header or not rendered.prompt.endswith(header):
        return token_ids
    tail = served.model.tokenize(header, False, True)
    start = len(token_ids) - len(tail)
    if not tail or start <= 0 or list(token_ids[start:]) != list(tail):
        return token_ids
    return with_checkpoint_hints(token_ids, (start,))


def render_request(served: ServedModel, request: ChatRequest) -> Rendered:
    """``request`` through the chat layer (:func:`.render.render`), continuation and
    generation prompt decided as llama-server decides them."""
    messages = list(request.messages)
    continues = _continues(request, messages, served.prefill_assistant)
    add = request.extra("add_generation_prompt", True)
    if not isinstance(add, bool):
        raise InvalidOptionError("add_generation_prompt must be a boolean",
                                 option="add_generation_prompt")
    return render(served, request, continues=continues, add=add)


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


def call_intent(served: ServedModel, ignore_eos: object, fields: Mapping[str, Any],
                budget: int | None, prompt_tokens: int) -> GenerationIntent:
    """The request's typed options: ``fields`` (the body's sampling fields and extras, plus
    what the API derived from its own fields) resolved by :meth:`ServedModel.intent`
    (``budget`` None: the server's default)."""
    return served.intent(fields, ignore_eos=ignore_eos, max_tokens=budget,
                         prompt_tokens=prompt_tokens)


def chat_fields(request: ChatRequest, rendered: Rendered, prompt_tokens: int
                ) -> dict[str, Any]:
    """The engine fields of a chat request: its own, the whole prompt pinned for
    ``retention_s`` (OpenAI's ``prompt_cache_retention``), what the chat format needs (a
    forced call's or a JSON answer's grammar, offered tools' lazy one, extra stops, the special
    tokens of its markers) and enough candidates for ``top_logprobs``. A request's own
    ``grammar`` constrains the output instead of the format's lazy tool grammar (the output is
    still read for calls); with a forced call or a JSON answer it is a 400."""
    fields = dict(request.fields)
    if request.retention_s is not None and "cache_pins" not in fields:
        fields["cache_pins"] = ((prompt_tokens, request.retention_s),)
    made = dict(rendered.fields)
    if fields.get("grammar") and made.get("grammar"):
        if not made.get("grammar_triggers"):
            raise InvalidOptionError("grammar conflicts with tools/response_format",
                                     option="grammar")
        del made["grammar"], made["grammar_triggers"]
    stops = made.pop("stop", [])
    if stops:
        own = fields.get("stop") or []
        fields["stop"] = [*([own] if isinstance(own, str) else own), *stops]
    fields.update(made)
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
    rendered = render_request(served, request)
    token_ids = _hinted(served, rendered, served.tokenize_prompt(rendered.prompt, media))
    fields = chat_fields(request, rendered, len(token_ids))
    intent = call_intent(served, request.extra("ignore_eos"), fields, request.max_tokens,
                         len(token_ids))
    plan = ChatPlan(
        served=served, request=request, prompt=rendered.prompt, token_ids=token_ids,
        intent=intent, tools_active=request.tools_active, rendered=rendered)
    plan.verbose  # noqa: B018 - a bad ``verbose`` is a 400 before generating
    return plan
