"""A single-user session on a ``Model``: its own context and a one-slot engine, on a private
tick thread the session owns (so ``adecode`` needs no thread per stream). LoRA adapters go
through the engine's adapter set, exactly as on a shared server."""

from __future__ import annotations

from llamapy._native import Model
from llamapy.adapters import resolve_adapters
from llamapy.engine.options import EngineConfig
from llamapy.fingerprint import start_fingerprint
from llamapy.runtime import TickLoop
from llamapy.runtime.native import host_model
from llamapy.session.config import SessionConfig, standalone_context_options
from llamapy.session.host import ServerHost
from llamapy.session.lease import open_off_loop
from llamapy.session.session import Session

__all__ = ["aopen_standalone", "open_standalone"]


def open_standalone(model: Model, config: SessionConfig | None = None, *,
                    owns_model: bool = False) -> Session:
    """A :class:`Session` on ``model`` with a private one-sequence context sized by ``config``
    (:func:`~llamapy.session.config.standalone_context_options`, which raises for unknown or
    conflicting ``context_options``). The session closes the context, its adapters and its
    thread; the model stays the caller's unless ``owns_model`` (then the session closes it
    last, as :func:`~llamapy.session.factory.open_path` asks)."""
    config = config or SessionConfig()
    start_fingerprint(model.path)  # the manifest names the model by it: hashed meanwhile
    adapter_set = resolve_adapters(config.adapters)
    options = standalone_context_options(config)
    engine = EngineConfig(n_parallel=1, n_batch=options.effective_n_batch,
                          chunk_size=options.effective_n_batch, kv_unified=options.kv_unified)
    loop = TickLoop(lambda: host_model(model, options, engine), thread_name="llamapy-session")
    host: ServerHost | None = None
    try:
        loop.ready.wait()
        if loop.load_error is not None:
            reason = loop.load_error.reason
            raise reason if isinstance(reason, BaseException) else loop.load_error
        owned = (model, loop) if owns_model else (loop,)  # closed in reverse: the model last
        host = ServerHost(loop, model, options, engine.sampling, adapter_set, owned=owned)
        return Session(host, config)
    except BaseException:
        (host or loop).close()
        raise


async def aopen_standalone(model: Model, config: SessionConfig | None = None) -> Session:
    """:func:`open_standalone` from a coroutine (in a worker thread: making a context blocks);
    cancelled, it closes the session the worker opens (:func:`~.lease.open_off_loop`)."""
    return await open_off_loop(lambda: open_standalone(model, config))
