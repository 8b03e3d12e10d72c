"""Helpers for engine example tests: engines on the fake backend."""

from __future__ import annotations

from collections.abc import Sequence

from llamapy.engine import (
    Engine,
    EngineConfig,
    EngineTuning,
    FakeBackend,
    FakeModel,
    Request,
    RequestOptions,
    SamplingParams,
)
from llamapy.engine.cache.disk import CacheNamespace
from llamapy.engine.testing import Recorder

SAMPLING_KEYS = frozenset(SamplingParams.__dataclass_fields__)


def make_engine(*, n_ctx: int = 1024, n_parallel: int = 2, unified: bool = True,
                partial: bool = True, tuning: EngineTuning | None = None,
                backend_kw: dict | None = None, cache_namespace: CacheNamespace | None = None,
                **config) -> tuple[Engine, FakeBackend]:
    """An engine on a fresh fake backend; ``config`` goes to :class:`EngineConfig`."""
    backend_kw = {"model": FakeModel(n_vocab=512), **(backend_kw or {})}
    backend = FakeBackend(n_ctx=n_ctx, n_seq_max=n_parallel, kv_unified=unified,
                          supports_partial_removal=partial, record_plans=True, **backend_kw)
    cfg = EngineConfig(n_parallel=n_parallel, kv_unified=unified, **config)
    engine = Engine(backend, cfg, tuning=tuning or EngineTuning(ram_min_tokens=4),
                    cache_namespace=cache_namespace)
    return engine, backend


def submit(engine: Engine, rid: object, prompt: Sequence[int], *, identity: str = "",
           lease_id: int | None = None, **options) -> Recorder:
    """Submit a request built from flat options; returns its recorder."""
    sampling = {k: options.pop(k) for k in list(options) if k in SAMPLING_KEYS}
    sampling.setdefault("seed", 1)
    sink = Recorder()
    opts = RequestOptions(sampling=SamplingParams(**sampling), **options)
    engine.submit(Request(rid, list(prompt), opts, sink, identity, lease_id))
    return sink


def ref(backend: FakeBackend, prompt: Sequence[int], max_tokens: int, *,
        adapters: tuple = (), **sampling) -> list[int]:
    """The oracle's output for a request (under adapter set ``adapters``)."""
    sampling.setdefault("seed", 1)
    return backend.model.reference(prompt, max_tokens, SamplingParams(**sampling), adapters)
