"""What a :class:`~llamapy.server.manager.ModelManager` serves: one :class:`ModelSpec` per model
(name, aliases, GGUF path, the model's own ``Server`` start options, ``keep_alive``, pinning),
the states a model moves through (:class:`ModelState`, one transition table), the snapshot
``status()`` reports (:class:`ModelStatus`), the server seam (:class:`ServerLike`, made by a
:data:`ServerFactory`; tests inject fakes) and the hold a request takes (:class:`ModelLease`).

``keep_alive`` follows Ollama: a duration (``30``, ``"90s"``, ``"5m"``, ``"1h"``; a bare number
is seconds), ``0`` unloads the model as soon as its last request ends, a negative value keeps it
loaded until it is unloaded explicitly or evicted for room.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from ..errors import IllegalTransitionError, InvalidOptionError
from .options import resolve_start_options

__all__ = [
    "KEEP_FOREVER",
    "ModelLease",
    "ModelSpec",
    "ModelState",
    "ModelStatus",
    "ServerFactory",
    "ServerLike",
    "check_transition",
    "default_server_factory",
    "estimate_memory_mb",
    "parse_keep_alive",
]

#: ``keep_alive`` value meaning "never unload for idleness".
KEEP_FOREVER = math.inf

_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ModelState(Enum):
    """Where a served model is: not in memory, loading, serving, or failed to load."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


_TRANSITIONS: dict[ModelState, frozenset[ModelState]] = {
    ModelState.UNLOADED: frozenset({ModelState.LOADING}),
    ModelState.LOADING: frozenset({ModelState.LOADED, ModelState.FAILED}),
    ModelState.LOADED: frozenset({ModelState.UNLOADED}),
    ModelState.FAILED: frozenset({ModelState.LOADING, ModelState.UNLOADED}),
}


def check_transition(current: ModelState, target: ModelState) -> None:
    """Raise :class:`IllegalTransitionError` unless ``current -> target`` is legal."""
    if target not in _TRANSITIONS[current]:
        raise IllegalTransitionError("served model", current.value, target.value)


def parse_keep_alive(value: object) -> float:
    """Seconds a model stays loaded once idle: ``0`` = unload at once, ``KEEP_FOREVER`` = keep.

    Accepts a number of seconds or an Ollama duration string; negative means keep forever.
    Raises :class:`InvalidOptionError` for anything else.
    """
    if isinstance(value, bool):
        raise InvalidOptionError(f"keep_alive must be a duration, got {value!r}",
                                 option="keep_alive")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise InvalidOptionError(
            f"keep_alive must be seconds or a duration like '5m', got {value!r}",
            option="keep_alive")
    if math.isnan(seconds):
        raise InvalidOptionError("keep_alive must not be NaN", option="keep_alive")
    return KEEP_FOREVER if seconds < 0 else seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """One model a manager may serve.

    ``options`` are the model's own ``Server`` start options (``n_ctx``, ``n_parallel``,
    ``n_threads``, ``lora``, ``chat_template``, ``spec_draft_model``, ...), validated here by the
    option tree: an unknown key raises :class:`~llamapy.errors.UnknownOptionError`.
    ``keep_alive`` ``None`` takes the manager's default. ``memory_mb`` overrides the estimate
    (:func:`estimate_memory_mb`). A ``pinned`` model is never unloaded for room or idleness.
    """

    name: str
    path: str | os.PathLike[str]
    aliases: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    keep_alive: float | str | None = None
    pinned: bool = False
    memory_mb: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise InvalidOptionError(f"model name must be a non-empty string, got {self.name!r}",
                                     option="name")
        if "name" in self.options:
            raise InvalidOptionError("a model's 'name' is the spec's name, not an option",
                                     option="name")
        resolve_start_options(self.path, self.options)
        if self.keep_alive is not None:
            parse_keep_alive(self.keep_alive)
        if self.memory_mb is not None and not self.memory_mb > 0:
            raise InvalidOptionError(f"memory_mb must be > 0, got {self.memory_mb!r}",
                                     option="memory_mb")

    @property
    def names(self) -> tuple[str, ...]:
        """The name, then the aliases: every name a request may use."""
        return (self.name, *self.aliases)


def estimate_memory_mb(spec: ModelSpec) -> float:
    """The memory a model is charged against the budget, in MiB.

    ``spec.memory_mb`` when given; otherwise the GGUF file's size (weights are mapped whole) plus
    the model's own draft model's file. The KV cache is not in the estimate: set ``memory_mb``
    for models whose context is large next to their weights. A missing file costs 0 here; its
    load fails with its own error.
    """
    if spec.memory_mb is not None:
        return float(spec.memory_mb)
    paths = [Path(spec.path)]
    draft = spec.options.get("spec_draft_model")
    if draft:
        paths.append(Path(draft))
    return sum(p.stat().st_size for p in paths if p.is_file()) / (1 << 20)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStatus:
    """A snapshot of one served model (what ``/v1/models`` lists)."""

    name: str
    aliases: tuple[str, ...]
    path: str
    state: ModelState
    error: str | None
    in_flight: int
    pinned: bool
    keep_alive: float
    memory_mb: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``keep_alive`` -1 for forever, like Ollama)."""
        return {"name": self.name, "aliases": list(self.aliases), "path": self.path,
                "state": self.state.value, "error": self.error, "in_flight": self.in_flight,
                "pinned": self.pinned,
                "keep_alive": -1 if self.keep_alive == KEEP_FOREVER else self.keep_alive,
                "memory_mb": round(self.memory_mb, 1)}


class ServerLike(Protocol):
    """What the manager needs of a server: the two lifecycle calls of :class:`Server`."""

    def wait_ready(self, timeout: float | None = None) -> Any:
        """Block until loaded; raise the typed load error if the load failed."""

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop serving and free the model; idempotent."""


ServerFactory = Callable[[ModelSpec], ServerLike]


def default_server_factory(spec: ModelSpec) -> ServerLike:
    """A real :class:`Server` for ``spec`` (its thread named after the model)."""
    from .server import Server

    return Server(spec.path, name=f"llamapy-{spec.name}", **spec.options)


class ModelLease:
    """A hold on one loaded model's server: while held the model is not unloaded.

    ``with manager.acquire("name") as server:``; or keep the lease and call :meth:`release`
    (idempotent) when the request ends.
    """

    def __init__(self, name: str, server: Any, release: Callable[[], None]) -> None:
        self.name = name
        self._server = server
        self._release: Callable[[], None] | None = release

    @property
    def server(self) -> Any:
        """The model's server (a :class:`~llamapy.server.Server` with the default factory)."""
        return self._server

    def release(self) -> None:
        """End the hold (keep_alive starts counting when the model's last hold ends)."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> Any:
        return self._server

    def __exit__(self, *exc: object) -> None:
        self.release()
