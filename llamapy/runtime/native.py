"""Hosting an engine on libllama: a context on a loaded model, its backend and its engine.

Runs on the tick thread that will own them (see :class:`~llamapy.runtime.loop.TickLoop`).
"""

from __future__ import annotations

from collections.abc import Hashable

from llamapy._native import Context, Model
from llamapy._native.context import ContextOptions
from llamapy.engine.engine import Engine
from llamapy.engine.model_drafter import ModelDrafter, check_same_vocab
from llamapy.engine.options import EngineConfig
from llamapy.llama_backend import LlamaBackend
from llamapy.runtime.loop import Hosted

__all__ = ["host_model"]


def host_model(model: Model, context: ContextOptions, config: EngineConfig,
               preload: tuple[Hashable, ...] = (), *, draft_model: Model | None = None
               ) -> Hosted:
    """A context on ``model`` with a backend and an engine; ``preload`` is an adapter set
    loaded now (a load failure fails the hosting). ``draft_model`` gets a context of the same
    size for the ``draft`` drafter (``InvalidOptionError`` unless it has the same vocabulary).
    ``Hosted.free`` frees the contexts, the adapters and the draft model; the model stays its
    holders' (it is freed when the last one drops it)."""
    ctx = Context(model, context)
    backend = LlamaBackend(model, ctx)
    parts: list[tuple[Context, LlamaBackend]] = [(ctx, backend)]
    try:
        backend.load_adapters(preload)
        drafters = {}
        if draft_model is not None:
            dctx = Context(draft_model, context)
            parts.append((dctx, LlamaBackend(draft_model, dctx)))
            check_same_vocab(backend, parts[1][1])
            drafters["draft"] = ModelDrafter(parts[1][1], config.spec_draft_p_min)
        engine = Engine(backend, config, drafters=drafters)
    except BaseException:
        _free(parts, draft_model)
        raise

    def free() -> None:
        _free(parts, draft_model)

    return Hosted(engine=engine, model=model, free=free)


def _free(parts: list[tuple[Context, LlamaBackend]], draft_model: Model | None) -> None:
    """Each context first, then the adapters it used; then the draft model."""
    for ctx, backend in parts:
        ctx.close()
        backend.close()
    if draft_model is not None:
        draft_model.close()
