"""Hosting an engine on libllama: a context on a loaded model, its backend and its engine.

Runs on the tick thread that will own them (see :class:`~llamapy.runtime.loop.TickLoop`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable
from typing import Any

from llamapy._native import Context, Model
from llamapy._native._loader import native
from llamapy._native.context import ContextOptions
from llamapy._pins import LLAMA_CPP_COMMIT
from llamapy.engine.cache.disk import CacheNamespace
from llamapy.engine.engine import Engine
from llamapy.engine.options import EngineConfig
from llamapy.engine.speculation.model_drafter import ModelDrafter, check_same_vocab
from llamapy.fingerprint import model_fingerprint
from llamapy.llama_backend import LlamaBackend
from llamapy.options.context import KV_RUNTIME_KEYS
from llamapy.runtime.hosting import Hosted
from llamapy.runtime.identity import describe_adapter_files, namespace_digest

__all__ = ["cache_namespace", "host_model"]


def host_model(model: Model, context: ContextOptions, config: EngineConfig,
               preload: tuple[Hashable, ...] = (), *, draft_model: Model | None = None,
               warmup: bool = False) -> Hosted:
    """A context on ``model`` with a backend and an engine; ``preload`` is an adapter set
    loaded now (a load failure fails the hosting). ``draft_model`` gets a context of the same
    size for the ``draft`` drafter (``InvalidOptionError`` unless it has the same vocabulary).
    ``Hosted.free`` frees the contexts, the adapters and the draft model; the model stays its
    holders' (it is freed when the last one drops it). ``warmup``: run
    :meth:`~llamapy._native.Context.warmup` on the new context(s) first."""
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
        if warmup:
            for part_ctx, _ in parts:
                part_ctx.warmup()
        namespace = cache_namespace(model, ctx) if config.prompt_cache_dir else None
        engine = Engine(backend, config, drafters=drafters, cache_namespace=namespace)
    except BaseException:
        _free(parts, draft_model)
        raise

    def free() -> None:
        _free(parts, draft_model)

    return Hosted(engine=engine, model=model, free=free,
                  progress=lambda: sum(part_ctx.progress for part_ctx, _ in parts))


def cache_namespace(model: Model, ctx: Context) -> CacheNamespace:
    """The disk prompt cache's namespace for KV computed by ``model`` in ``ctx``: the model
    file's fingerprint (:func:`~llamapy.fingerprint.model_fingerprint`, started when the model
    loaded; waited for here) and size, its tokenizer, built-in chat template and BOS policy, the
    context's KV-shaping options and per-sequence size, and the libllama build (its file's
    fingerprint and the pinned llama.cpp commit); adapters are named by their files'
    fingerprints."""
    return CacheNamespace(namespace_digest(namespace_parts(model, ctx)),
                          describe_adapters=describe_adapter_files)


def namespace_parts(model: Model, ctx: Context) -> dict[str, Any]:
    """The readable parts :func:`cache_namespace` digests."""
    meta = model.metadata()
    tokenizer = {k: v for k, v in sorted(meta.items())
                 if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}
    options = ctx.options
    return {
        "model": model_fingerprint(model.path), "model_size": model.path.stat().st_size,
        "tokenizer": _sha({**tokenizer, "n_vocab": model.n_vocab}),
        "chat_template": _sha(model.chat_template() or ""), "add_bos": model.add_bos,
        "kv": {"n_ctx_seq": ctx.n_ctx_seq, "kv_unified": options.kv_unified,
               **{k: getattr(options, k) for k in KV_RUNTIME_KEYS}},
        "libllama": model_fingerprint(native().lib_path), "llama_cpp": LLAMA_CPP_COMMIT,
    }


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _free(parts: list[tuple[Context, LlamaBackend]], draft_model: Model | None) -> None:
    """Each context first, then the adapters it used; then the draft model."""
    for ctx, backend in parts:
        ctx.close()
        backend.close()
    if draft_model is not None:
        draft_model.close()
