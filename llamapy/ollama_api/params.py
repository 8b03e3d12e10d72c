"""Ollama request bodies (pydantic models), as Ollama's ``docs/api.md`` documents them.

Top-level fields are Ollama's; any other top-level field is a 400 naming it (the body is
validated once, at the edge). Messages and tool calls echoed back from a response are data,
not options: keys we do not use there are ignored. ``options`` are checked for type here
(:class:`Options`, strict: no string for a number, no float for an integer); their ranges are
the option tree's (:mod:`llamapy.options`), checked when the request is resolved. Keys of
``options`` that Ollama knows but that change nothing here, and keys nobody knows, are ignored
with a logged warning, as Ollama does (see :mod:`.options`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

#: ``think``: a boolean, or an effort level (accepted as ``true``).
Think = StrictBool | Literal["low", "medium", "high"]
#: ``format``: ``""`` (none), ``"json"`` (any JSON value) or a JSON schema object.
Format = Literal["", "json"] | dict[str, Any]
#: ``keep_alive``: seconds or a duration string (``"5m"``); checked by :func:`.options.keep_alive`.
KeepAlive = StrictInt | StrictFloat | str
#: The longest ``stop`` list (each entry is matched on every token).
MAX_STOP = 16


class _Strict(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid")


class _Data(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="ignore")


class Options(BaseModel):
    """``options``: Ollama's runtime parameters, typed (unknown keys kept for the warning)."""

    model_config = ConfigDict(defer_build=True, extra="allow", strict=True)

    num_predict: int | None = Field(default=None, ge=-2)
    num_ctx: int | None = Field(default=None, ge=1)
    num_keep: int | None = Field(default=None, ge=-1)
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = Field(default=None, max_length=MAX_STOP)
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    # Ollama's load-time and legacy parameters: typed, accepted, no effect here.
    numa: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None
    penalize_newline: bool | None = None
    tfs_z: float | None = None


class ToolCallFunction(_Data):
    """``function`` of a tool call: ``arguments`` is an object (not JSON text)."""

    name: str = Field(min_length=1, max_length=64)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(_Data):
    """One entry of an assistant message's ``tool_calls``."""

    id: str | None = None
    function: ToolCallFunction


class Message(_Data):
    """One chat message; ``tool_name`` names the tool a ``tool`` message answers."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class GenerationBody(_Strict):
    """What ``/api/chat`` and ``/api/generate`` share."""

    model: str = Field(min_length=1, max_length=512)
    stream: StrictBool = True
    format: Format | None = None
    options: Options | None = None
    keep_alive: KeepAlive | None = None
    think: Think | None = None
    logprobs: StrictBool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class ChatBody(GenerationBody):
    """``POST /api/chat``; empty ``messages`` only loads (or unloads) the model."""

    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None
    truncate: StrictBool | None = None
    shift: StrictBool | None = None


class GenerateBody(GenerationBody):
    """``POST /api/generate``; an empty ``prompt`` only loads (or unloads) the model."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[StrictInt] | None = None
    raw: StrictBool = False
    images: list[str] | None = None
    truncate: StrictBool | None = None
    shift: StrictBool | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None


class EmbedBody(_Strict):
    """``POST /api/embed``: ``input`` a string or a list of them."""

    model: str = Field(min_length=1, max_length=512)
    input: str | list[str] = Field(min_length=1)
    truncate: StrictBool = True
    dimensions: int | None = Field(default=None, ge=1)
    options: Options | None = None
    keep_alive: KeepAlive | None = None


class EmbeddingsBody(_Strict):
    """``POST /api/embeddings`` (Ollama's legacy form): one ``prompt``."""

    model: str = Field(min_length=1, max_length=512)
    prompt: str | None = None
    options: Options | None = None
    keep_alive: KeepAlive | None = None


class ShowBody(_Strict):
    """``POST /api/show`` (``name`` is the older spelling of ``model``)."""

    model: str | None = Field(default=None, max_length=512)
    name: str | None = Field(default=None, max_length=512)
    verbose: StrictBool = False
    system: str | None = None
    template: str | None = None
    options: Options | None = None

    @property
    def model_name(self) -> str:
        """The model asked about (``model``, else ``name``; "" for none)."""
        return self.model or self.name or ""


class ModelOpBody(_Data):
    """The bodies of ``/api/pull``, ``push``, ``create``, ``copy`` and ``delete``: only the
    model they name is read (each answers a typed refusal, see :mod:`.models`)."""

    model: str | None = Field(default=None, max_length=512)
    name: str | None = Field(default=None, max_length=512)
    source: str | None = Field(default=None, max_length=512)
    stream: StrictBool = True

    @property
    def model_name(self) -> str:
        """The model the operation names ("" for none)."""
        return self.model or self.name or self.source or ""
