"""A single-user session on a ``Model``: its own context and a one-slot engine, driven inline
in the caller's thread (no server thread). LoRA adapters attach to that private context."""

from __future__ import annotations

from typing import Any

from llamapy._native import Context, Model
from llamapy._native.model import LoraAdapter
from llamapy.embeddings import Embedder
from llamapy.engine.engine import Engine
from llamapy.engine.options import EngineConfig
from llamapy.llama_backend import LlamaBackend
from llamapy.session.config import SessionConfig, standalone_context_options
from llamapy.session.host import InlineHost, model_manifest, runtime_of
from llamapy.session.manifest import file_digest
from llamapy.session.session import Session

__all__ = ["open_standalone"]


def open_standalone(model: Model, config: SessionConfig | None = None) -> Session:
    """A :class:`Session` on ``model`` with a private one-sequence context sized by ``config``
    (:func:`~llamapy.session.config.standalone_context_options`, which raises for unknown or
    conflicting ``context_options``). The session closes the context and adapters it created;
    the model stays the caller's."""
    config = config or SessionConfig()
    options = standalone_context_options(config)
    owned: list[Any] = []
    try:
        ctx = Context(model, options)
        owned.append(ctx)
        adapters = [(LoraAdapter(model, spec.path), spec.scale) for spec in config.adapters]
        owned[:0] = [a for a, _ in adapters]  # adapters are freed after the context
        if adapters:
            ctx.set_adapters(adapters)
        backend = LlamaBackend(model, ctx)
        engine = Engine(backend, EngineConfig(n_parallel=1, n_batch=options.effective_n_batch,
                                              chunk_size=options.effective_n_batch,
                                              kv_unified=options.kv_unified))
        identity = tuple((file_digest(s.path), float(s.scale)) for s in config.adapters)
        manifest = model_manifest(model, runtime_of(options, backend.n_ctx_seq), identity)
        host = InlineHost(engine, manifest, add_bos=model.add_bos, owned=tuple(owned),
                          embedder=lambda: Embedder(model, n_threads=options.n_threads,
                                                    adapters=adapters),
                          tokenize=lambda text, special: model.tokenize(text, special, True),
                          detokenize=lambda ids: model.detokenize(ids, False, True))
        return Session(host, config)
    except BaseException:
        for obj in reversed(owned):
            obj.close()
        raise
