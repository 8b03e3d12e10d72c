"""Where the app's models come from: one :class:`ModelSource`, whatever their number.

An app serves either one model (:class:`~llamapy.serve.host.ModelHost`: a one-spec
:class:`~llamapy.server.ModelManager`, asleep under ``--sleep-idle-seconds``) or several
(:class:`~llamapy.serve.multi.ModelRouter` over a manager of many specs). Both are a
``ModelSource``: the routes ask it for the request's model, the model listings and the
middleware that holds a model for a request, and never ask which of the two they run on.
What differs is each class's own answer (one model lists itself, llama-server's way; several
list every spec with its state, router mode's way).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from ..openai_api import ServedModel
from ..server import ModelManager
from .model_use import RoutePolicy
from .tenants import Principal

__all__ = ["Listed", "ModelSource", "model_card"]


@dataclass(frozen=True, slots=True)
class Listed:
    """One served model as the listings show it: its name and file, the model while it is
    loaded (None: not loaded), and its keep-alive in seconds (< 0 or inf: kept)."""

    name: str
    path: str
    served: ServedModel | None
    keep_alive: float = -1.0


class ModelSource(Protocol):
    """What the routes need of the app's models (see the module)."""

    #: The manager that owns the models' lives.
    manager: ModelManager

    @property
    def several(self) -> bool:
        """Whether the app serves several models (router mode: ``/models/load|unload``)."""

    @property
    def sleeping(self) -> bool:
        """Whether the model is asleep (``--sleep-idle-seconds``; never with several)."""

    @property
    def snapshot(self) -> dict[str, Any]:
        """What the read-only routes answer while asleep (``props``, ``models``, ``stats``)."""

    @property
    def pulls(self) -> bool:
        """Whether a Hub model that is not served is pulled when named."""

    def current(self) -> ServedModel:
        """The request's model: 503 with the reason while it is unavailable."""

    def model_name(self) -> str:
        """The request's model's public id ("" while there is none)."""

    def steady(self) -> AbstractContextManager[bool]:
        """Around a read-only route's read: the model is not unloaded meanwhile; yields
        whether it is asleep (then read :attr:`snapshot`)."""

    def check_health(self) -> None:
        """Raise the 503 of an app that cannot serve (a model asleep can: it wakes)."""

    def check_named(self, requested: str | None) -> None:
        """Raise the 404 of a model name that is not served (nothing for a name that is)."""

    def peek(self, requested: str | None) -> ServedModel | None:
        """The named model if loaded now, without holding it (None: not loaded)."""

    def state_of(self, requested: str | None) -> tuple[str, str]:
        """``(name, state)`` of a model :meth:`peek` found not loaded."""

    def model_states(self) -> list[dict[str, str]]:
        """Each model's ``{"id", "state"}`` for the live view's picker (one model: none)."""

    def listing(self) -> list[Listed]:
        """The served models, loaded or not (blocking)."""

    def model_list(self) -> dict[str, Any]:
        """``/v1/models`` (blocking)."""

    def model_entry(self, model_id: str) -> dict[str, Any]:
        """``/v1/models/{id}``: 404 unless served here (blocking)."""

    def serves(self, name: str) -> bool:
        """Whether ``name`` (with Ollama's ``:latest`` or without) is served here."""

    async def pick_or_pull(self, requested: str | None, principal: Principal) -> str:
        """The served name for ``requested``, pulling a Hub model first with :attr:`pulls`
        (``hf.co/...`` names only, and only for an admin's ``principal``: else a 403)."""

    def keep(self, name: str, seconds: float | None) -> None:
        """A request's ``keep_alive`` for ``name`` (one model: kept as configured)."""

    def shares_embedder(self) -> bool:
        """Whether the embeddings context is made once and kept (one model), rather than per
        request (several: a kept one would pin an unloaded model's weights)."""

    def hold(self, requested: str | None, principal: Principal
             ) -> AbstractAsyncContextManager[None]:
        """Hold the requested model for an ``async with`` block outside the HTTP middleware
        (a WebSocket's response): several models' one leased, a sleeping one woken."""

    def middleware(self, check_key: Callable[[Any], Any], policy: RoutePolicy
                   ) -> list[tuple[Any, dict[str, Any]]]:
        """The innermost middleware, as ``(class, keywords)``: what holds the request's model
        for its response, on the routes ``policy`` says need it (``check_key`` checks the API
        key first)."""

    def metrics_collectors(self) -> list[Any]:
        """``/metrics`` collectors of the models beyond the engine's."""

    def on_sleep(self, hook: Callable[[ServedModel], None]) -> None:
        """Call ``hook`` before the model falls asleep (never, for a source that never
        sleeps)."""

    def wait_started(self, timeout: float | None) -> ServedModel | None:
        """Wait (at most ``timeout`` s) for a model starting with the app; the model, or None
        (several: none starts with the app)."""

    def close(self) -> None:
        """Unload every model."""


def model_card(served: ServedModel) -> dict[str, Any]:
    """One entry of ``/v1/models`` for a loaded model (``aliases``: every name it answers to,
    the id first, as llama-server lists them)."""
    model = served.model
    return {"id": served.name, "object": "model", "created": served.created,
            "owned_by": "llamapy",
            "meta": {"n_ctx_train": model.n_ctx_train, "n_embd": model.n_embd,
                     "n_params": model.n_params, "size": model.size, "n_vocab": model.n_vocab,
                     "description": model.description},
            "aliases": [served.name, *served.aliases],
            "capabilities": capabilities(served),
            **({"tags": list(served.tags)} if served.tags else {})}


def capabilities(served: ServedModel) -> list[str]:
    """llama-server's model capabilities: ``completion``, and ``multimodal`` with a
    projector."""
    media = any(served.server.modalities.values())
    return ["completion", *(["multimodal"] if media else [])]


def model_listing(served: ServedModel) -> dict[str, Any]:
    """``/v1/models`` of one model as llama-server answers it: OpenAI's ``data`` and, for
    Ollama-style clients, ``models`` (with the capabilities)."""
    entry = {"name": served.name, "model": served.name, "modified_at": "", "size": "",
             "digest": "", "type": "model", "description": "", "tags": [""],
             "capabilities": capabilities(served), "parameters": "",
             "details": {"parent_model": "", "format": "gguf", "family": "",
                         "families": [""], "parameter_size": "", "quantization_level": ""}}
    return {"models": [entry], "object": "list", "data": [model_card(served)]}
