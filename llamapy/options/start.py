"""A ``Server``'s start options, composed from the option dataclasses of the tree.

A ``Server`` takes flat keyword options (``Server(path, n_ctx=4096, temp=0.2)``). They split into:
the server's own sizing (:class:`ServerOptions`), the engine's scheduling options and sampling
defaults (:class:`~llamapy.options.EngineConfig`), context tuning options
(:func:`~llamapy.options.tuning_option_keys`: the context's sizing comes from the server's) and
model loading options (all but :data:`~llamapy.options.MODEL_ONLY_KEYS`). Unknown keys raise
:class:`~llamapy.errors.UnknownOptionError` naming the valid ones; ``model_path`` is
``Server``'s positional argument, ``n_seq_max`` is ``n_parallel`` and ``vocab_only`` is
refused (a vocabulary-only model cannot decode).
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llamapy.errors import InvalidOptionError, UnknownOptionError
from llamapy.options._spec import check, is_int, is_num, option, option_names, required
from llamapy.options.context import (
    N_CTX,
    N_PARALLEL,
    ContextOptions,
    default_n_batch,
    tuning_option_keys,
)
from llamapy.options.engine import EngineConfig, engine_option_keys, make_engine_config
from llamapy.options.model import MODEL_ONLY_KEYS, ModelOptions, load_option_keys
from llamapy.options.sampling import SamplingParams, request_option_keys

__all__ = [
    "CALL_OPTION_KEYS",
    "START_OPTION_OWNERS",
    "CallOptions",
    "ResolvedStart",
    "ServerOptions",
    "call_option_keys",
    "model_load_options",
    "resolve_start_options",
    "server_request_option_keys",
    "start_option_keys",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallOptions:
    """The options of a blocking or streaming call that are not engine request options (their
    names and types; the ``Server`` methods read them from the call's keywords)."""

    timeout: float | None = option(None, "seconds the call (or each event of a stream) may "
                                   "take (None = no limit; not given = the method's default)")
    request_id: Hashable = option(None, "the request's id, for cancel() from elsewhere "
                                  "(default: a fresh one)", accepts="Hashable")


#: Per-call options that are not engine request options.
CALL_OPTION_KEYS = option_names(CallOptions)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerOptions:
    """The server's own options. ``n_batch=None`` means ``min(n_ctx, 2048)``.

    ``lora`` lists LoRA adapter files loaded at start (a load failure fails the start);
    requests select them by index (the HTTP ``lora: [{"id", "scale"}]`` field) or pass
    ``adapters`` directly in-process. ``spec_draft_model`` is loaded next to the model, with the
    same loading options and a context of the same size, for the ``draft`` drafter.
    ``warmup`` runs llama-server's warm-up decode before the server reports ready.
    ``mmproj`` is a multimodal projector GGUF for the model: requests may then send images
    (and audio, for an audio projector), see :meth:`~llamapy.server.Server.media_prompt`.
    """

    model_path: str = required("the GGUF model file (Server's positional argument)")
    n_ctx: int = option(N_CTX, "context size in tokens, shared by all slots when kv_unified",
                        flags=("-c", "--ctx-size"))
    n_parallel: int = option(N_PARALLEL, "slots: requests decoded concurrently (n_seq_max)",
                             flags=("-np", "--parallel"))
    n_batch: int | None = option(None, "most tokens per decode call (default: min(n_ctx, 2048))",
                                 flags=("-b", "--batch-size"))
    name: str | None = option(None, "server thread name (default: llamapy-server)")
    lora: tuple[str, ...] = option((), "LoRA adapter files loaded at start (select by index)")
    spec_draft_model: str | None = option(
        None, "draft model GGUF (same vocabulary) for speculative decoding; implies "
        "--spec-type draft when no type is given", flags=("-md", "--model-draft"))
    mmproj: str | None = option(
        None, "multimodal projector GGUF of the model: requests may send images (and audio, "
        "for an audio projector)", flags=("-mm", "--mmproj"))
    mmproj_offload: bool = option(True, "run the multimodal projector on the GPU when there "
                                  "is one (llama-server's --mmproj-offload)")
    warmup: bool = option(True, "decode BOS+EOS once after loading, before taking work, so the "
                          "first request skips the first decode's one-time costs (llama-server's "
                          "--warmup)")
    stall_timeout: float = option(
        300.0, "seconds one tick or command of the model's thread may run without the model "
        "computing before the server counts as dead (/health 503, exit status 70 so that a "
        "supervisor restarts it; a long decode at work never counts; 0 = never)")

    def __post_init__(self) -> None:
        check(is_int(self.n_ctx) and self.n_ctx >= 1, "n_ctx", "must be an integer >= 1")
        check(is_int(self.n_parallel) and self.n_parallel >= 1, "n_parallel",
              "must be an integer >= 1")
        check(self.n_batch is None or (is_int(self.n_batch) and self.n_batch >= 1), "n_batch",
              "must be an integer >= 1")
        check(self.name is None or (isinstance(self.name, str) and bool(self.name)), "name",
              "must be a non-empty string or None")
        check(is_num(self.stall_timeout) and 0 <= self.stall_timeout <= 86_400,
              "stall_timeout", "must be within [0, 86400] seconds")

    @property
    def effective_n_batch(self) -> int:
        """``n_batch``, defaulting to ``min(n_ctx, 2048)``."""
        return self.n_batch if self.n_batch is not None else default_n_batch(self.n_ctx)


#: The classes that define start options, in the order their CLI flags are grouped (the first
#: owner of a name describes it), with the group titles.
START_OPTION_OWNERS: tuple[tuple[type, str], ...] = (
    (ServerOptions, "server sizing"),
    (EngineConfig, "scheduling and prompt cache"),
    (SamplingParams, "sampling defaults (requests may override them)"),
    (ContextOptions, "context tuning"),
    (ModelOptions, "model loading"),
)


def _own_keys() -> tuple[str, ...]:
    return option_names(ServerOptions, exclude=("model_path",))


def _load_keys() -> list[str]:
    return [k for k in load_option_keys() if k not in MODEL_ONLY_KEYS]


def start_option_keys() -> list[str]:
    """Every option ``Server(path, ...)`` accepts."""
    keys = set(_own_keys()) | set(engine_option_keys()) | set(tuning_option_keys())
    return sorted(keys | set(_load_keys()))


def server_request_option_keys() -> list[str]:
    """Per-request options of ``generate``/``stream``/... beyond ``max_tokens``/``timeout``."""
    return [k for k in request_option_keys() if k != "max_tokens"]


def call_option_keys() -> list[str]:
    """Every keyword a generation call accepts (request options, ``max_tokens``, ``timeout``)."""
    return sorted(set(request_option_keys()) | set(CALL_OPTION_KEYS))


@dataclass(frozen=True, slots=True)
class ResolvedStart:
    """Start options split by the component that owns them."""

    server: ServerOptions
    engine: EngineConfig
    context: ContextOptions
    model: ModelOptions


def _pick(options: Mapping[str, Any], keys: Any) -> dict[str, Any]:
    wanted = set(keys)
    return {k: v for k, v in options.items() if k in wanted}


def _server_options(model_path: str | os.PathLike[str], options: Mapping[str, Any]
                    ) -> ServerOptions:
    own = _pick(options, _own_keys())
    if "lora" in own:
        if isinstance(own["lora"], (str, os.PathLike)):
            raise InvalidOptionError("lora must be a sequence of paths", option="lora")
        own["lora"] = tuple(str(Path(p).expanduser().resolve()) for p in own["lora"])
    return ServerOptions(model_path=str(Path(model_path)), **own)


def _with_draft_type(engine: EngineConfig, server: ServerOptions) -> EngineConfig:
    """A draft model without a ``spec_type`` turns the ``draft`` drafter on (llama-server's
    ``-md`` alone does); ``draft`` without a draft model is refused."""
    kinds = engine.speculative.type
    if server.spec_draft_model and not kinds:
        return replace(engine, spec_type="draft")
    if "draft" in kinds and not server.spec_draft_model:
        raise InvalidOptionError("spec_type 'draft' needs a draft model (spec_draft_model, "
                                 "--spec-draft-model / -md)", option="spec_type")
    return engine


def resolve_start_options(model_path: str | os.PathLike[str], options: Mapping[str, Any]
                          ) -> ResolvedStart:
    """Split and validate flat start options (raises on unknown keys or bad values)."""
    unknown = set(options) - set(start_option_keys())
    if unknown:
        raise UnknownOptionError(unknown, start_option_keys(), where="start")
    server = _server_options(model_path, options)
    engine_opts = {k: v for k, v in _pick(options, engine_option_keys()).items()
                   if k != "n_batch"}
    engine_opts.setdefault("n_parallel", server.n_parallel)
    engine = _with_draft_type(
        make_engine_config({**engine_opts, "n_batch": server.effective_n_batch}), server)
    tuning = _pick(options, tuning_option_keys())
    if tuning.get("pooling_type") == "rank":  # (a reranker's context outputs its scores)
        tuning["embeddings"] = True
    context = ContextOptions(
        n_ctx=server.n_ctx, n_batch=server.effective_n_batch, n_seq_max=server.n_parallel,
        kv_unified=engine.kv_unified, **tuning,
    )
    return ResolvedStart(server, engine, context, model_load_options(options))


def model_load_options(options: Mapping[str, Any]) -> ModelOptions:
    """The model-loading part of flat start options, validated on its own (what a prefetch of
    the weights needs before the rest is resolved; unknown keys are left to
    :func:`resolve_start_options`)."""
    return ModelOptions(**_pick(options, _load_keys()))
