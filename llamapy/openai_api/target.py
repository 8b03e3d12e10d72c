"""What the API functions run on: a :class:`ServedModel` (a ``Server`` plus how to present it).

The API functions accept a :class:`~llamapy.server.Server`, a loaded
:class:`~llamapy.server.Model` (run through a private single-slot ``Server`` on the same file,
closed when the model is collected) or a :class:`ServedModel`, which adds what a bare server
does not know: the public model name, a chat template override and the request timeout.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..chat.layer import ChatOutput, model_templates, source_templates
from ..errors import EndpointDisabledError, InvalidOptionError, ModelNotFoundError
from ..media.sources import MediaFetch
from ..options.limits import RequestLimits
from ..options.serve import SERVE_OPTION_NAMES, ServeOptions
from ..server import Completion, GenerationIntent, Model, ModelInfo, Server
from ..server.chat_format import ChatTemplates
from .cache_report import (
    AsyncReportedEvents,
    ReportedEvents,
    reported_completion,
)
from .params import BiasSpec, choice_seed, lora_adapters

SyncEvents = ReportedEvents
AsyncEvents = AsyncReportedEvents

#: Start options of the private server that runs API calls on a bare ``Model`` (adjustable).
PRIVATE_SERVER_OPTIONS: dict[str, object] = {"n_parallel": 1}

#: The serving options' defaults (the option tree's).
_DEFAULTS = ServeOptions()

#: Default per-request timeout of API calls (whole call; per token when streaming), seconds.
DEFAULT_REQUEST_TIMEOUT: float = _DEFAULTS.request_timeout

_private_servers: weakref.WeakKeyDictionary[Model, Server] = weakref.WeakKeyDictionary()

def _special_text(model: ModelInfo, token: int) -> str:
    return model.token_text(token) if token >= 0 else ""


@dataclass(eq=False)
class ServedModel:
    """A server as the API presents it.

    ``name`` is the public model id (default: the file's stem) and ``aliases`` more ids it
    answers to; requests naming another model than one of :attr:`names` get
    :class:`~llamapy.errors.ModelNotFoundError`. ``tags`` are informational (``/v1/models``).
    ``chat_template`` overrides the GGUF's template (Jinja source). The server-wide request
    defaults (llama-server's flags): ``n_predict`` is the token budget of a request that sets
    none (-1: the rest of the context), ``reasoning_format`` the ``reasoning_format`` of a
    request that sets none, ``template_kwargs`` chat template variables a request's
    ``chat_template_kwargs`` extend (``--reasoning off``: ``enable_thinking: false``);
    ``prefill_assistant``: a conversation ending with an assistant message is continued
    (``--no-prefill-assistant``: answered in a new turn instead); ``spm_infill``: ``/infill``
    puts the suffix before the prefix (``--spm-infill``); ``verbose``: responses carry
    llama-server's ``__verbose`` debug object (the rendered prompt, ...) unless a request sets
    ``verbose: false`` (``--verbose``; a request's ``verbose: true`` asks for it anyway);
    ``default_ignore_eos``: a request that sets no ``ignore_eos`` ignores end-of-generation
    tokens (``--ignore-eos``; a request's ``ignore_eos: false`` stops at them);
    ``cache_report``: how much responses say about prefix reuse, ``exact``, ``coarse`` or
    ``off`` (``--cache-report``, :mod:`.cache_report`): every event and completion the API
    functions read comes through :meth:`events` / :meth:`complete` and their async forms,
    which apply it;
    ``tenant``: the tenant every request made through this object runs in (None: the default
    tenant); the HTTP app hands each request a view bound to its API key's
    (:meth:`for_tenant`).
    """

    server: Server
    name: str = ""
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    chat_template: str | None = None
    request_timeout: float = _DEFAULTS.request_timeout
    n_predict: int = _DEFAULTS.n_predict
    reasoning_format: str = _DEFAULTS.reasoning_format
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    accept_any_model: bool = _DEFAULTS.accept_any_model
    prefill_assistant: bool = _DEFAULTS.prefill_assistant
    spm_infill: bool = _DEFAULTS.spm_infill
    verbose: bool = False
    default_ignore_eos: bool = _DEFAULTS.default_ignore_eos
    cache_report: str = _DEFAULTS.cache_report
    media_path: str | None = _DEFAULTS.media_path
    media_remote: bool = _DEFAULTS.media_remote
    media_remote_private: bool = _DEFAULTS.media_remote_private
    created: int = field(default_factory=lambda: int(time.time()))
    tenant: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            self.name = Path(self.server.model_path).stem
        check_presentation(self.chat_template,
                           **{name: getattr(self, name) for name in SERVE_OPTION_NAMES
                              if hasattr(self, name)})

    @property
    def names(self) -> frozenset[str]:
        """Model ids a request may use for this model."""
        path = Path(self.server.model_path)
        return frozenset({self.name, *self.aliases, path.stem, path.name, str(path)})

    def check_model(self, requested: str | None) -> None:
        """Raise :class:`ModelNotFoundError` unless ``requested`` is empty or one of ours (any
        name passes with ``accept_any_model``, as llama-server answers any)."""
        if requested is not None and not isinstance(requested, str):
            raise InvalidOptionError("model must be a string", option="model")
        if requested and requested not in self.names and not self.accept_any_model:
            raise ModelNotFoundError(
                f"model {requested!r} is not served here (serving {self.name!r}; start the "
                "server with --accept-any-model to answer any model name)"
            )

    @property
    def model(self) -> ModelInfo:
        """The loaded model (raises the server's typed error while loading or after failure)."""
        return self.server.model

    def chat_templates(self) -> ChatTemplates:
        """The chat templates (llama.cpp's chat layer): the override, else the GGUF's, else
        ChatML."""
        return model_templates(self.model, self.chat_template or None)

    def special_tokens(self) -> tuple[str, str]:
        """The BOS and EOS tokens' text ("" for a token the model lacks)."""
        model = self.model
        return _special_text(model, model.bos), _special_text(model, model.eos)

    def output_parser(self, *, reasoning: bool, prompt_tail: str = "") -> ChatOutput:
        """A parser of raw output (no tools): reasoning read as the template's format reads
        it when ``reasoning``, the output starting inside it when ``prompt_tail`` (the end of
        the prompt) opens it."""
        params = self.chat_templates().apply(
            {"messages": [{"role": "user", "content": ""}], "enable_thinking": reasoning,
             "reasoning_format": "auto" if reasoning else "none"})
        opened = reasoning and params.thinking_start_tag and prompt_tail.rstrip().endswith(
            params.thinking_start_tag.rstrip())
        if opened and not params.generation_prompt.rstrip().endswith(
                params.thinking_start_tag.rstrip()):
            params = dataclasses.replace(
                params, generation_prompt=params.generation_prompt + params.thinking_start_tag)
        return ChatOutput(params, reasoning_format="auto" if reasoning else "none",
                          tools=False)

    def tokenize_prompt(self, text: str, media: Sequence[bytes] = ()) -> Sequence[int]:
        """Tokenize rendered prompt text (special tokens parsed; BOS added once); with
        ``media``, each media marker in ``text`` stands for the next item
        (:meth:`Server.media_prompt`, as :attr:`tenant`'s: a
        :class:`~llamapy.engine.media.MediaPrompt`)."""
        model = self.model
        bos = _special_text(model, model.bos)
        add_special = model.add_bos and not (bos and text.startswith(bos))
        if media:
            return self.server.media_prompt(text, media, add_special=add_special,
                                            tenant=self.tenant)
        return model.tokenize(text, add_special, True)

    @property
    def limits(self) -> RequestLimits:
        """The serving limits on one request."""
        return self.server.start_options.engine

    @property
    def media_fetch(self) -> MediaFetch:
        """Where a request's image URLs may point besides the request itself."""
        return MediaFetch(self.limits.max_media_bytes, self.media_remote, self.media_path,
                          private=self.media_remote_private)

    def events(self, token_ids: Sequence[int], intent: GenerationIntent) -> SyncEvents:
        """The request's event stream (:meth:`Server.open_stream`; closing it cancels), as
        :attr:`cache_report` reports it."""
        return ReportedEvents(self.server.open_stream(token_ids, intent), self.cache_report)

    def aevents(self, token_ids: Sequence[int], intent: GenerationIntent) -> AsyncEvents:
        """The request's async event stream (:meth:`Server.open_astream`), as
        :attr:`cache_report` reports it."""
        return AsyncReportedEvents(self.server.open_astream(token_ids, intent),
                                   self.cache_report)

    def complete(self, token_ids: Sequence[int], intent: GenerationIntent) -> Completion:
        """The whole request (:meth:`Server.complete_tokens`), as :attr:`cache_report`
        reports it."""
        done = self.server.complete_tokens(token_ids, intent)
        return reported_completion(done, self.cache_report)

    async def acomplete(self, token_ids: Sequence[int], intent: GenerationIntent
                        ) -> Completion:
        """Async :meth:`complete`; cancelling the task cancels the request."""
        done = await self.server.acomplete_tokens(token_ids, intent)
        return reported_completion(done, self.cache_report)

    async def acomplete_all(self, calls: Sequence[tuple[Sequence[int], GenerationIntent]]
                            ) -> list[Completion]:
        """Requests that live and die together (:meth:`Server.acomplete_all`), as
        :attr:`cache_report` reports them."""
        done = await self.server.acomplete_all(calls)
        return [reported_completion(completion, self.cache_report) for completion in done]

    def for_tenant(self, tenant: str | None) -> ServedModel:
        """This model as ``tenant``'s requests see it: itself for its own tenant, else a shallow
        copy (nothing validated or compiled again) whose requests carry ``tenant``."""
        if tenant == self.tenant:
            return self
        view = copy.copy(self)
        view.tenant = tenant
        return view

    def intent(self, fields: Mapping[str, Any], *, ignore_eos: object = None,
               max_tokens: int | None = None, prompt_tokens: int = 0) -> GenerationIntent:
        """A request's :class:`~llamapy.server.GenerationIntent`, resolved the same way for
        every API: the one place an API request becomes typed engine options.

        ``fields`` are the request's sampling and engine options under the engine's names or
        their aliases (a parsed ``logit_bias``, llama-server's ``lora`` selection); added are
        the server's part: the adapter files of the ``lora`` selection, the :attr:`tenant` (a
        body cannot set ``tenant``: :data:`~.params.SERVER_ONLY`), each text ``logit_bias``
        entry as the tokens of its tokenization (no special tokens, as llama-server does; a
        token id outside the vocabulary is a 400), llama-server's ``ignore_eos`` (None: the
        server's :attr:`default_ignore_eos`; true bans every end-of-generation token; not a
        boolean: a 400), the token budget (``max_tokens``, else :meth:`default_max_tokens` for
        ``prompt_tokens``, from the context size the server published at load) and the
        request timeout. Then :meth:`Server.resolve` renames, defaults and checks them once.
        A server that ranks (``--reranking``: rank pooling) generates nothing: a 501.
        """
        if self.server.start_options.context.pooling_type == "rank":
            raise EndpointDisabledError("This server ranks documents (started with "
                                        "`--reranking`): it does not generate text; use "
                                        "/rerank")
        options = dict(fields)
        if "lora" in options:
            options["adapters"] = lora_adapters(options.pop("lora"), self.server.lora_adapters)
        if self.tenant is not None:
            options["tenant"] = self.tenant
        if options.get("logit_bias"):
            options["logit_bias"] = resolve_logit_bias(self.model, options["logit_bias"])
        if self._ignores_eos(ignore_eos):
            bias = dict(options.get("logit_bias") or {})
            bias.update(dict.fromkeys(self.model.eog_tokens(), float("-inf")))
            options["logit_bias"] = bias
        options["max_tokens"] = self.default_max_tokens(prompt_tokens) if max_tokens is None \
            else max_tokens
        options["timeout"] = self.request_timeout
        return self.server.resolve(**options)

    def revise(self, intent: GenerationIntent, **changes: Any) -> GenerationIntent:
        """``intent`` with some options changed, checked again (:meth:`Server.revise`)."""
        return self.server.revise(intent, **changes)

    def choices(self, intent: GenerationIntent, n: int) -> list[GenerationIntent]:
        """The intents of ``n`` choices of one prompt, each seeded by :func:`.params.choice_seed`
        from the request's seed."""
        seed = intent.options.sampling.seed
        return [intent if choice_seed(seed, i) == seed else self.revise(
            intent, seed=choice_seed(seed, i)) for i in range(n)]

    def _ignores_eos(self, flag: object) -> bool:
        if flag is None:
            return self.default_ignore_eos
        if not isinstance(flag, bool):
            raise InvalidOptionError("ignore_eos must be a boolean", option="ignore_eos")
        return flag

    def n_ctx_seq(self) -> int:
        """Context tokens one request may use (0 while the model loads)."""
        return self.server.n_ctx_seq

    def default_max_tokens(self, prompt_tokens: int) -> int:
        """Generation budget when a request sets none: ``n_predict`` (llama-server's ``-n``)
        within the rest of the context, else the rest of the context."""
        n_ctx = self.n_ctx_seq()
        rest = max(1, n_ctx - prompt_tokens) if n_ctx else 256
        return min(self.n_predict, rest) if self.n_predict >= 0 else rest


def check_presentation(chat_template: str | None = None, **options: Any) -> None:
    """Check the :class:`ServedModel` options before any server exists: the serving options
    among ``options`` through the option tree (:class:`~llamapy.options.ServeOptions`), and a
    chat template override by compiling it (so a broken one fails at startup, not at the first
    request)."""
    ServeOptions(**{k: v for k, v in options.items() if k in SERVE_OPTION_NAMES})
    if chat_template:
        source_templates(chat_template)


def resolve_logit_bias(model: ModelInfo, spec: BiasSpec) -> dict[int, float]:
    """``token id -> bias`` of a parsed ``logit_bias`` on ``model``'s vocabulary."""
    out: dict[int, float] = {}
    for key, bias in spec.items():
        if isinstance(key, str):
            out.update(dict.fromkeys(model.tokenize(key, False, False), bias))
        elif 0 <= key < model.n_vocab:
            out[key] = bias
        else:
            raise InvalidOptionError(
                f"logit_bias token id {key} is outside the vocabulary (0..{model.n_vocab - 1})",
                option="logit_bias")
    return out


def private_server(model: Model) -> Server:
    """The single-slot server that runs API calls on a bare ``Model`` (one per model)."""
    server = _private_servers.get(model)
    if server is None:
        server = Server(model.path, **PRIVATE_SERVER_OPTIONS)
        _private_servers[model] = server
        weakref.finalize(model, server.close)
    return server


def served(target: Server | Model | ServedModel) -> ServedModel:
    """The :class:`ServedModel` of an API call's target."""
    if isinstance(target, ServedModel):
        return target
    if isinstance(target, Server):
        return ServedModel(target)
    if isinstance(target, Model):
        return ServedModel(private_server(target), name=target.path.stem)
    raise TypeError(f"expected a Server, a Model or a ServedModel, got {type(target).__name__}")
