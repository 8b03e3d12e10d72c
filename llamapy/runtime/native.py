"""Hosting an engine on libllama: a context on a loaded model, its backend and its engine.

Runs on the tick thread that will own them (see :class:`~llamapy.runtime.loop.TickLoop`).
"""

from __future__ import annotations

from collections.abc import Hashable

from llamapy._native import Context, Model
from llamapy._native.context import ContextOptions
from llamapy.engine.engine import Engine
from llamapy.engine.options import EngineConfig
from llamapy.llama_backend import LlamaBackend
from llamapy.runtime.loop import Hosted

__all__ = ["host_model"]


def host_model(model: Model, context: ContextOptions, config: EngineConfig,
               preload: tuple[Hashable, ...] = ()) -> Hosted:
    """A context on ``model`` with a backend and an engine; ``preload`` is an adapter set
    loaded now (a load failure fails the hosting). ``Hosted.free`` frees the context and the
    adapters; the model stays its holders' (it is freed when the last one drops it)."""
    ctx = Context(model, context)
    backend = LlamaBackend(model, ctx)
    try:
        backend.load_adapters(preload)
        engine = Engine(backend, config)
    except BaseException:
        _free(ctx, backend)
        raise

    def free() -> None:
        _free(ctx, backend)

    return Hosted(engine=engine, model=model, free=free)


def _free(ctx: Context, backend: LlamaBackend) -> None:
    """Context first, then the adapters it used."""
    ctx.close()
    backend.close()
