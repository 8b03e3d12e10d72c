"""OpenAI request bodies (pydantic models) and their translation into engine request options.

Field names and semantics follow the OpenAI API. Fields that are not OpenAI's ("extras") are
accepted when they are engine request options (``top_k``, ``min_p``, ``grammar``,
``cache_prompt``, ``cache_scope``, ``session``, ... as listed by
:func:`llamapy.server.server_request_option_keys`) or llama-server's spelling of one
(:data:`ENGINE_ALIASES`). Any other unknown field is a 400 naming it: nothing is silently
dropped. A body that fails validation raises :class:`~llamapy.errors.InvalidOptionError` with
``option`` set to the offending field's path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from ..errors import InvalidOptionError, UnknownOptionError, UnsupportedFeatureError
from ..options import ALIASES, LLAMA_DEFAULT_SEED
from ..server import server_request_option_keys

#: llama-server / OpenAI names of engine request options that the engine spells differently:
#: the part of the tree's alias table (:data:`llamapy.options.ALIASES`) that names request
#: options (the token budget spellings are fields of their own).
ENGINE_ALIASES: dict[str, str] = {
    alias: name for alias, name in ALIASES.items() if name in server_request_option_keys()
}

#: Extras that are ours, not engine options: handled by the API layer itself.
API_EXTRAS = ("reasoning_format", "chat_template_kwargs", "json_schema", "lora", "ignore_eos",
              "continue_final_message", "add_generation_prompt", "verbose")
#: Engine options a client may not set over HTTP: file paths on the server's disk, and the
#: tenant (the server takes it from the API key).
SERVER_ONLY = ("adapters", "tenant")

_SERVER_ONLY_HINTS = {
    "adapters": "adapters cannot be set over HTTP; start the server with --lora PATH and select "
                "adapters with lora: [{\"id\": N, \"scale\": S}]",
    "tenant": "tenant cannot be set over HTTP: it is the API key's (--api-key-file lines "
              "'KEY TENANT'); use cache_scope for a sub-scope inside it",
}

Body = TypeVar("Body", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid")


class StreamOptions(_Strict):
    """``stream_options``."""

    include_usage: bool = False


class FunctionDef(_Strict):
    """A tool's ``function``."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    """One entry of ``tools``."""

    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    """``{"name": ...}`` of a named tool choice."""

    name: str


class NamedToolChoice(_Strict):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"]
    function: FunctionName


class JsonSchemaFormat(_Strict):
    """``response_format.json_schema``."""

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """``response_format``; llama.cpp's ``{"type": "json_object", "schema": ...}`` too."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class Message(BaseModel):
    """One chat message; extra keys (``name``, ``reasoning_content``, ...) pass through."""

    model_config = ConfigDict(defer_build=True, extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class GenerationBody(BaseModel):
    """Fields shared by chat and text completions."""

    model_config = ConfigDict(defer_build=True, extra="allow", populate_by_name=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Any] | list[Any] | None = None
    n: int = Field(default=1, ge=1, le=128)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


#: Seconds each ``prompt_cache_retention`` pins the whole prompt for.
RETENTION_S = {"in_memory": 300.0, "in-memory": 300.0, "24h": 86_400.0}


class ChatBody(GenerationBody):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    #: The ``session`` affinity key when the body sets no ``session``.
    prompt_cache_key: str | None = Field(default=None, max_length=256)
    #: Pins the whole prompt in the RAM prompt cache (:data:`RETENTION_S`).
    prompt_cache_retention: Literal["in_memory", "in-memory", "24h"] | None = None

    def token_budget(self) -> int | None:
        """``max_completion_tokens`` or else ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class CompletionBody(GenerationBody):
    """``POST /v1/completions``."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_field(part: object) -> bool:
    """Whether a pydantic error location part names a field or index (not a union tag)."""
    if isinstance(part, int):
        return True
    return bool(re.fullmatch(r"[a-z_][a-z0-9_]*", str(part))) and part not in _TYPE_TAGS


def parse_body(model: type[Body], body: object) -> Body:
    """Validate a JSON body; a validation failure is an :class:`InvalidOptionError`."""
    if not isinstance(body, Mapping):
        raise InvalidOptionError("request body must be a JSON object")
    try:
        return model.model_validate(dict(body))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if _is_field(part)) or None
        raise InvalidOptionError(
            f"invalid field {where!r}: {first['msg']}" if where else first["msg"], option=where
        ) from None


def check_unsupported(body: GenerationBody) -> None:
    """Reject what we do not implement, clearly (``n`` > 1 streamed on ``/v1/completions``,
    ``best_of`` > 1, ``suffix``)."""
    if isinstance(body, CompletionBody):
        if body.n > 1 and body.stream:
            raise UnsupportedFeatureError("n", "n > 1 is streamed on /v1/chat/completions; "
                                          "here set stream to false")
        if body.best_of not in (None, 1):
            raise UnsupportedFeatureError("best_of", "only best_of=1 is supported")
        if body.suffix:
            raise UnsupportedFeatureError("suffix", "suffix (fill-in-the-middle) is unsupported")


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` of ``n`` choices of one prompt (they run concurrently and
    share the prompt's prefix in the cache): a fixed seed is offset per choice, so seeded
    choices are reproducible but not all alike; a random one (-1) stays random."""
    if index == 0 or seed < 0 or seed == LLAMA_DEFAULT_SEED:
        return seed
    return (seed + index) % LLAMA_DEFAULT_SEED  # (LLAMA_DEFAULT_SEED itself: random)


#: The largest ``|bias|`` a request may set (OpenAI's range); ``false`` bans a token.
MAX_LOGIT_BIAS = 100.0

#: ``logit_bias`` as parsed, before the vocabulary is known: token id or text -> bias.
BiasSpec = dict[int | str, float]


def logit_bias(value: object) -> BiasSpec:
    """Every llama-server form of ``logit_bias``, checked but not yet tokenized.

    An object ``{"15043": -1}`` or a list ``[[15043, -1.0]]``; a key or first element that is
    not an integer is text (:func:`~.target.resolve_logit_bias` gives each of its tokens the
    bias); ``false`` bans (``-inf``). A bias must be a finite number within
    :data:`MAX_LOGIT_BIAS`; anything else is a 400.
    """
    if isinstance(value, Mapping):
        pairs: list[Any] = list(value.items())
    elif isinstance(value, list):
        pairs = value
    else:
        raise InvalidOptionError("logit_bias must be an object or a list of [token, bias]",
                                 option="logit_bias")
    out: BiasSpec = {}
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise InvalidOptionError("logit_bias entries must be [token, bias]",
                                     option="logit_bias")
        out[_bias_key(pair[0])] = _bias_value(pair[1])
    return out


def _bias_key(token: object) -> int | str:
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    if not isinstance(token, str):
        raise InvalidOptionError(f"logit_bias key {token!r} is neither a token id nor text",
                                 option="logit_bias")
    try:
        return int(token)
    except ValueError:
        return token


def _bias_value(bias: object) -> float:
    if bias is False:
        return -math.inf
    if isinstance(bias, bool) or not isinstance(bias, (int, float)):
        raise InvalidOptionError(f"logit_bias value {bias!r} is not a number or false",
                                 option="logit_bias")
    if not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS:
        raise InvalidOptionError(
            f"logit_bias value {bias!r} is outside [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}] "
            "(use false to ban a token)", option="logit_bias")
    return float(bias)


def engine_extras(extra: Mapping[str, Any]) -> dict[str, Any]:
    """Engine options from a body's extra fields (aliases renamed); unknown names raise."""
    engine_keys = set(server_request_option_keys())
    out: dict[str, Any] = {}
    unknown = []
    for key, value in extra.items():
        name = ENGINE_ALIASES.get(key, key)
        if key in API_EXTRAS or value is None:  # null means "not set"
            continue
        if key.startswith(SPEC_PREFIX):  # llama-server's flat "speculative.n_max" spelling
            _speculative_field(out, key.removeprefix(SPEC_PREFIX), value)
            continue
        if name in SERVER_ONLY:
            raise InvalidOptionError(_SERVER_ONLY_HINTS[name], option=key)
        if name in engine_keys:
            out[name] = value
        else:
            unknown.append(key)
    if unknown:
        valid = engine_keys | set(ENGINE_ALIASES) | set(API_EXTRAS)
        raise UnknownOptionError(unknown, valid, where="request")
    if "logit_bias" in out:
        out["logit_bias"] = logit_bias(out["logit_bias"])
    if "session" in out and isinstance(out["session"], list):
        out["session"] = tuple(out["session"])
    if extra.get("lora") is not None:
        out["lora"] = extra["lora"]
    return out


#: llama-server's prefix of per-request speculative fields (``speculative.n_max``, ...).
SPEC_PREFIX = "speculative."


def _speculative_field(out: dict[str, Any], field: str, value: Any) -> None:
    """Merge one ``speculative.<field>`` into ``out["speculative"]`` (a mapping)."""
    spec = out.get("speculative")
    if isinstance(spec, str | bool | list):
        spec = {"type": ("ngram" if spec else "off") if isinstance(spec, bool) else spec}
    spec = dict(spec or {})
    spec[field] = value
    out["speculative"] = spec


def lora_adapters(selection: Any, loaded: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """llama-server's ``lora: [{"id": N, "scale": S}]`` as an adapter set over ``loaded``."""
    if not isinstance(selection, list):
        raise InvalidOptionError("lora must be a list of {id, scale}", option="lora")
    out = []
    for item in selection:
        if not isinstance(item, dict) or not isinstance(item.get("id"), int):
            raise InvalidOptionError("each lora entry needs an integer id", option="lora")
        index, scale = item["id"], item.get("scale", 1.0)
        if not 0 <= index < len(loaded):
            raise InvalidOptionError(f"lora id {index} is not loaded ({len(loaded)} adapters)",
                                     option="lora")
        if not isinstance(scale, (int, float)) or isinstance(scale, bool):
            raise InvalidOptionError("lora scale must be a number", option="lora")
        if scale != 0:
            out.append((loaded[index], float(scale)))
    return tuple(out)


def sampling_options(body: GenerationBody) -> dict[str, Any]:
    """Engine request options for a body's OpenAI sampling fields plus its extras."""
    out = engine_extras(body.model_extra or {})
    fields = {
        "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed,
        "presence_penalty": body.presence_penalty, "frequency_penalty": body.frequency_penalty,
    }
    for key, value in fields.items():
        if value is not None:
            out[ENGINE_ALIASES.get(key, key)] = value
    if body.stop is not None:
        out["stop"] = [body.stop] if isinstance(body.stop, str) else list(body.stop)
    if body.logit_bias is not None:
        out["logit_bias"] = logit_bias(body.logit_bias)
    return out


def api_extra(body: BaseModel, key: str, default: Any = None) -> Any:
    """One of :data:`API_EXTRAS` from a body."""
    return (body.model_extra or {}).get(key, default)
