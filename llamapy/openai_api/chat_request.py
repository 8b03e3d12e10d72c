"""A chat request in no API's shape: :class:`ChatRequest`, what every chat API's parser makes.

OpenAI chat completions (:func:`from_chat_body`), the Anthropic Messages API, the OpenAI
Responses API and Ollama's ``/api/chat`` and ``/api/generate`` each validate their own body
and translate it, once, into this frozen value: the conversation as the chat template gets it,
the tools, the tool choice and response format, the engine fields for
:meth:`~.target.ServedModel.intent`, the API extras (template variables, continuation) and the
token budget. :func:`~.prompt.prepare_request` turns it into a plan; no API's body is rebuilt
in another API's shape or parsed twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .params import API_EXTRAS, RETENTION_S, ChatBody, ResponseFormat, sampling_options

__all__ = ["ChatRequest", "from_chat_body"]

@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    """One chat generation request, validated by its API (see the module).

    ``messages`` are the template's messages (roles ``system``, ``user``, ``assistant``,
    ``tool``; history the template cannot show already inlined where the API does that);
    ``tools`` OpenAI function tools; ``tool_choice`` ``auto``, ``none``, ``required`` or
    ``{"type": "function", "function": {"name"}}``; ``parallel_tool_calls`` None: as the
    template can; ``fields`` the engine options under any
    of their spellings (sampling, ``session``, ``cache_pins``, llama-server's extras);
    ``extras`` the API extras of :data:`~.params.API_EXTRAS` (``chat_template_kwargs``,
    ``continue_final_message``, ...); ``max_tokens`` the budget (None: the server's);
    ``top_logprobs`` alternatives per token (None: no logprobs); ``retention_s`` pins the whole
    prompt for that many seconds unless ``fields`` pins it already; ``n`` choices and
    ``include_usage`` are OpenAI's (a usage chunk when streaming).
    """

    messages: tuple[Mapping[str, Any], ...]
    model: str | None = None
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str | Mapping[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    extras: Mapping[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    top_logprobs: int | None = None
    retention_s: float | None = None
    n: int = 1
    include_usage: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))
        object.__setattr__(self, "extras", MappingProxyType(dict(self.extras)))

    def extra(self, key: str, default: Any = None) -> Any:
        """One of the API extras (``default`` when absent)."""
        return self.extras.get(key, default)

    @property
    def tools_active(self) -> bool:
        """Whether tools are offered (some tools, and ``tool_choice`` is not ``none``)."""
        return bool(self.tools) and self.tool_choice != "none"


def api_extras(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The API extras among a body's extra fields."""
    return {key: extra[key] for key in API_EXTRAS if key in extra and key != "lora"}


def template_messages(body: ChatBody) -> tuple[dict[str, Any], ...]:
    """An OpenAI body's messages as the template gets them (``developer`` becomes
    ``system``)."""
    out = []
    for message in body.messages:
        item = message.model_dump(exclude_none=True)
        if item["role"] == "developer":
            item["role"] = "system"
        out.append(item)
    return tuple(out)


def from_chat_body(body: ChatBody, *, engine: bool = True) -> ChatRequest:
    """The :class:`ChatRequest` of a validated OpenAI chat body: ``prompt_cache_key`` is the
    ``session`` unless the body sets one, ``prompt_cache_retention`` pins the prompt. Without
    ``engine`` the engine fields are left out unread (for a request that is only rendered)."""
    fields = sampling_options(body) if engine else {}
    if body.prompt_cache_key is not None:
        fields.setdefault("session", body.prompt_cache_key)
    choice = body.tool_choice
    retention = body.prompt_cache_retention
    return ChatRequest(
        messages=template_messages(body), model=body.model,
        tools=tuple(tool.model_dump(exclude_none=True, by_alias=True)
                    for tool in body.tools or []),
        tool_choice=choice if choice is None or isinstance(choice, str) else choice.model_dump(),
        parallel_tool_calls=body.parallel_tool_calls, response_format=body.response_format,
        fields=fields, extras=api_extras(body.model_extra or {}), max_tokens=body.token_budget(),
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        retention_s=None if retention is None else RETENTION_S[retention], n=body.n,
        include_usage=body.include_usage())
