"""Server start options: one frozen dataclass per concern, and the key lists derived from them.

A ``Server`` takes flat keyword options (as the seed's ``start_link/1`` does). They split into:
the server's own sizing (:class:`ServerOptions`), the engine's scheduling options and sampling
defaults (:class:`~llamapy.engine.EngineConfig`), context tuning options forwarded to the
context (:func:`~llamapy._native.tuning_option_keys`) and model loading options
(:func:`~llamapy._native.load_option_keys`). Unknown keys raise
:class:`~llamapy.errors.UnknownOptionError` naming the valid ones.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .._native.context import ContextOptions, tuning_option_keys
from .._native.model import ModelOptions, load_option_keys
from .._system import physical_cores
from ..engine.options import (
    EngineConfig,
    engine_option_keys,
    make_engine_config,
)
from ..engine.options import (
    request_option_keys as engine_request_option_keys,
)
from ..errors import InvalidOptionError, UnknownOptionError

#: Per-call options that are not engine request options.
CALL_OPTION_KEYS = ("timeout", "request_id")
DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_STREAM_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerOptions:
    """The server's own options. ``n_batch=None`` means ``min(n_ctx, 2048)``.

    ``lora`` lists LoRA adapter files loaded at start (a load failure fails the start);
    requests select them by index (the HTTP ``lora: [{"id", "scale"}]`` field) or pass
    ``adapters`` directly in-process.
    """

    model_path: str
    n_ctx: int = 8192
    n_parallel: int = 4
    n_batch: int | None = None
    name: str | None = None
    lora: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.n_ctx, int) or self.n_ctx < 1:
            raise InvalidOptionError("n_ctx must be an integer >= 1", option="n_ctx")
        if not isinstance(self.n_parallel, int) or self.n_parallel < 1:
            raise InvalidOptionError("n_parallel must be an integer >= 1", option="n_parallel")
        if self.n_batch is not None and (not isinstance(self.n_batch, int) or self.n_batch < 1):
            raise InvalidOptionError("n_batch must be an integer >= 1", option="n_batch")

    @property
    def effective_n_batch(self) -> int:
        """``n_batch``, defaulting to ``min(n_ctx, 2048)``."""
        return self.n_batch if self.n_batch is not None else min(self.n_ctx, 2048)


def _own_keys() -> tuple[str, ...]:
    return tuple(f.name for f in fields(ServerOptions))


def start_option_keys() -> list[str]:
    """Every option ``Server(...)`` accepts."""
    keys = set(_own_keys()) | set(engine_option_keys()) | set(tuning_option_keys())
    return sorted(keys | set(load_option_keys()))


def request_option_keys() -> list[str]:
    """Per-request options of ``generate``/``stream``/... beyond ``max_tokens``/``timeout``."""
    return [k for k in engine_request_option_keys() if k != "max_tokens"]


def call_option_keys() -> list[str]:
    """Every keyword a generation call accepts (request options, ``max_tokens``, ``timeout``)."""
    return sorted(set(engine_request_option_keys()) | set(CALL_OPTION_KEYS))


@dataclass(frozen=True, slots=True)
class ResolvedStart:
    """Start options split by the component that owns them."""

    server: ServerOptions
    engine: EngineConfig
    context: ContextOptions
    model: ModelOptions


def resolve_start_options(model_path: str | os.PathLike[str], options: Mapping[str, Any]
                          ) -> ResolvedStart:
    """Split and validate flat start options (raises on unknown keys or bad values)."""
    unknown = set(options) - set(start_option_keys())
    if unknown or "model_path" in options:
        raise UnknownOptionError(unknown or {"model_path"}, start_option_keys(), where="start")
    own = {k: v for k, v in options.items() if k in _own_keys()}
    if "lora" in own:
        if isinstance(own["lora"], (str, os.PathLike)):
            raise InvalidOptionError("lora must be a sequence of paths", option="lora")
        own["lora"] = tuple(str(Path(p).expanduser().resolve()) for p in own["lora"])
    server = ServerOptions(model_path=str(Path(model_path)), **own)
    engine_keys = set(engine_option_keys())
    engine_opts = {k: v for k, v in options.items() if k in engine_keys and k != "n_batch"}
    engine_opts.setdefault("n_parallel", server.n_parallel)
    engine = make_engine_config({**engine_opts, "n_batch": server.effective_n_batch})
    tuning = {k: v for k, v in options.items() if k in set(tuning_option_keys())}
    tuning.setdefault("n_threads", physical_cores())
    context = ContextOptions(
        n_ctx=server.n_ctx, n_batch=server.effective_n_batch, n_seq_max=server.n_parallel,
        kv_unified=engine.kv_unified, **tuning,
    )
    loading = {k: v for k, v in options.items() if k in set(load_option_keys())}
    if "tensor_split" in loading:
        loading["tensor_split"] = tuple(loading["tensor_split"])
    return ResolvedStart(server, engine, context, ModelOptions(**loading))
