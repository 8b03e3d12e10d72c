"""Sessions on the fake backend: an engine driven inline, a byte tokenizer, a fake manifest."""

from __future__ import annotations

from pathlib import Path

from llamapy.engine.cache.disk import CacheNamespace
from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.options import EngineConfig, EngineTuning, SamplingParams
from llamapy.session import ContextManifest, InlineHost, Session, SessionConfig
from llamapy.session.manifest import sha256_hex

BOS = 1


def fake_tokenize(text: str, add_special: bool) -> list[int]:
    """Bytes to tokens 2..63 (0 is EOG, 1 is BOS)."""
    ids = [2 + b % 62 for b in text.encode()]
    return [BOS, *ids] if add_special else ids


def fake_manifest(**changes: object) -> ContextManifest:
    """A manifest for the fake model."""
    base = ContextManifest(model_digest=sha256_hex("fake-model"), tokenizer=sha256_hex("bytes"),
                           chat_template_digest=sha256_hex(""),
                           runtime_digest=sha256_hex("fake-runtime"), bos_policy="bos")
    return base.replace(**changes)


def make_engine(n_ctx: int = 512, n_parallel: int = 2, **kw: object) -> Engine:
    """A fake engine with greedy-ish deterministic sampling defaults."""
    backend = FakeBackend(n_ctx=n_ctx * n_parallel, n_seq_max=n_parallel, n_batch=64,
                          kv_unified=False)
    config = EngineConfig(n_parallel=n_parallel, n_batch=64, chunk_size=32, kv_unified=False,
                          sampling=SamplingParams(seed=7, temp=0.8), **kw)  # type: ignore[arg-type]
    return Engine(backend, config)


def open_fake(engine: Engine, config: SessionConfig | None = None,
              manifest: ContextManifest | None = None) -> Session:
    """A session on ``engine`` (inline host)."""
    host = InlineHost(engine, manifest or fake_manifest(), tokenize=fake_tokenize)
    return Session(host, config or SessionConfig(lease_timeout=0.5, request_timeout=5.0))


def disk_engine(folder: Path) -> Engine:
    """A fake engine whose disk prompt cache is ``folder``."""
    backend = FakeBackend(n_ctx=1024, n_seq_max=2, n_batch=64, kv_unified=False)
    config = EngineConfig(n_parallel=2, n_batch=64, chunk_size=32, kv_unified=False,
                          prompt_cache_dir=str(folder), sampling=SamplingParams(seed=7, temp=0.8))
    return Engine(backend, config, tuning=EngineTuning(disk_background=False),
                  cache_namespace=CacheNamespace("fake"))
