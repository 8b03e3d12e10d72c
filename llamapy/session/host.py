"""Where a session's requests run: a shared :class:`~llamapy.server.Server` (its tick thread
batches the session with other traffic) or an :class:`~llamapy.engine.engine.Engine` driven
inline in the caller's thread (standalone sessions on a ``Model``, and tests on the fake
backend).

A host offers the few things a session needs: tokenize, lease/release a slot, submit a request
and wait for its events, run a function on the engine's owner thread between ticks.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from llamapy import __version__
from llamapy._pins import LLAMA_CPP_COMMIT
from llamapy.embeddings import Embedder
from llamapy.engine.engine import Engine
from llamapy.engine.options import SamplingParams
from llamapy.engine.request import Event, Request
from llamapy.errors import LeaseTimeoutError, RequestTimeoutError, UnsupportedFeatureError
from llamapy.server.adapters import resolve_adapters
from llamapy.session.config import AdapterSpec
from llamapy.session.manifest import ContextManifest, file_digest, runtime_digest, sha256_hex

if TYPE_CHECKING:
    from llamapy._native import Model
    from llamapy.server import Server

__all__ = ["EventQueue", "InlineHost", "LazyEmbedder", "ServerHost", "SessionHost",
           "model_manifest"]

T = TypeVar("T")
_LEASE_POLL_S = 0.02

#: Context options that change what the KV holds (the runtime part of the manifest).
RUNTIME_KEYS = ("type_k", "type_v", "flash_attn", "rope_scaling_type", "rope_freq_base",
                "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast",
                "yarn_beta_slow", "yarn_orig_ctx", "swa_full")


class EventQueue:
    """The events of one request (the engine's sink feeds it)."""

    def __init__(self) -> None:
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()

    def sink(self, event: Event) -> bool:
        """Called on the engine's owner thread."""
        self.events.put(event)
        return True


class LazyEmbedder:
    """A host's :class:`~llamapy.embeddings.Embedder`, created on first use (its context costs
    memory only for sessions that embed) and closed with the host."""

    def __init__(self, factory: Callable[[], Embedder] | None) -> None:
        self._factory = factory
        self._embedder: Embedder | None = None

    def embed(self, texts: list[str]) -> np.ndarray:
        """An ``(n, n_embd)`` matrix of L2-normalised float32 rows."""
        if self._factory is None:
            raise UnsupportedFeatureError("embeddings", "this session host has no model to "
                                          "embed with")
        if self._embedder is None:
            self._embedder = self._factory()
        return self._embedder.embed(texts)

    def close(self) -> None:
        """Free the embeddings context (if one was made); idempotent."""
        if self._embedder is not None:
            self._embedder.close()


class SessionHost(Protocol):
    """What a :class:`~llamapy.session.Session` runs on."""

    n_ctx: int
    sampling: SamplingParams
    base_manifest: ContextManifest
    add_bos: bool

    def tokenize(self, text: str, add_special: bool) -> list[int]: ...

    def detokenize(self, token_ids: list[int]) -> str: ...

    def lease(self, scope: str | None, identity: str, timeout: float) -> int: ...

    def release(self, lease_id: int) -> None: ...

    def submit(self, request: Request) -> None: ...

    def wait(self, events: EventQueue, timeout: float) -> Event: ...

    def cancel(self, request_id: Any) -> None: ...

    def call(self, fn: Callable[[Engine], T]) -> T: ...

    def embed(self, texts: list[str]) -> np.ndarray: ...

    def close(self) -> None: ...


def model_manifest(model: Model, runtime: dict[str, Any],
                   adapters: tuple[tuple[str, float], ...] = ()) -> ContextManifest:
    """The base manifest (no segments) of a native model under ``runtime`` settings."""
    meta = model.metadata()
    tok = {k: v for k, v in sorted(meta.items()) if k.startswith("tokenizer.")
           and k != "tokenizer.chat_template"}
    tok["n_vocab"] = str(model.n_vocab)
    full_runtime = {**runtime, "llama_cpp": LLAMA_CPP_COMMIT, "llamapy": __version__}
    return ContextManifest(
        model_digest=file_digest(model.path), tokenizer=sha256_hex(json.dumps(tok)),
        chat_template_digest=sha256_hex(model.chat_template() or ""),
        runtime_digest=runtime_digest(full_runtime), bos_policy="bos" if model.add_bos else
        "no_bos", adapters=adapters, runtime=full_runtime,
    )


def runtime_of(options: Any, n_ctx_seq: int) -> dict[str, Any]:
    """The runtime part of the manifest from ``ContextOptions``."""
    return {"n_ctx": n_ctx_seq, **{k: getattr(options, k) for k in RUNTIME_KEYS}}


class ServerHost:
    """A session on a shared :class:`Server`: requests batch with everyone else's."""

    def __init__(self, server: Server, start: Any, adapters: tuple[AdapterSpec, ...]) -> None:
        self.server = server.wait_ready()
        #: The session's LoRA set: the engine never batches or reuses KV across sets, so the
        #: session's requests share the model with everyone else's under their own adapters.
        self.adapter_set = resolve_adapters(adapters)
        server.call_on_loop(lambda loop: loop.backend.load_adapters(self.adapter_set))
        self.sampling = start.engine.sampling
        self.n_ctx = server.call_on_loop(lambda loop: loop.backend.n_ctx_seq)
        model = server.model
        self.add_bos = model.add_bos
        digests = tuple((file_digest(path), scale) for path, scale in self.adapter_set)
        self.base_manifest = model_manifest(model, runtime_of(start.context, self.n_ctx),
                                            digests)
        self._embeddings = LazyEmbedder(lambda: Embedder(model,
                                                         n_threads=start.context.n_threads))

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """Tokenize with the served model (special tokens parsed)."""
        return self.server.model.tokenize(text, add_special, True)

    def detokenize(self, token_ids: list[int]) -> str:
        """Token ids to text (special tokens rendered)."""
        return self.server.model.detokenize(token_ids, False, True)

    def lease(self, scope: str | None, identity: str, timeout: float) -> int:
        """Lease a slot, polling until ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            lease_id = self.call(lambda engine: engine.lease(scope, identity, self.adapter_set))
            if lease_id is not None:
                return int(lease_id)
            if time.monotonic() >= deadline:
                raise LeaseTimeoutError(f"no slot could be leased within {timeout} s")
            time.sleep(_LEASE_POLL_S)

    def release(self, lease_id: int) -> None:
        """End the lease (if the server still runs)."""
        if self.server.ready:
            self.call(lambda engine: engine.release(lease_id))

    def submit(self, request: Request) -> None:
        """Hand the request to the tick thread (errors arrive as an ``ErrorEvent``), under the
        session's adapter set."""
        if self.adapter_set:
            request.options = dataclasses.replace(request.options, adapters=self.adapter_set)
        self.server.submit_request(request)

    def wait(self, events: EventQueue, timeout: float) -> Event:
        """The next event; ``RequestTimeoutError`` past ``timeout``."""
        try:
            return events.events.get(timeout=timeout)
        except queue.Empty:
            raise RequestTimeoutError(f"no session event within {timeout} s") from None

    def cancel(self, request_id: Any) -> None:
        """Cancel a request."""
        self.server.cancel(request_id)

    def call(self, fn: Callable[[Engine], T]) -> T:
        """Run ``fn(engine)`` on the tick thread."""
        return self.server.call_on_loop(lambda loop: fn(loop.engine))  # type: ignore[no-any-return]

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embeddings on the session's own embeddings context (the server's base model: the
        server's loaded adapters belong to its tick thread and are not applied here)."""
        return self._embeddings.embed(texts)

    def close(self) -> None:
        """Free the embeddings context; the server owns the model."""
        self._embeddings.close()


class InlineHost:
    """A session on an engine driven in the caller's thread (ticks run while it waits).

    ``owned`` objects (a private context, adapters) are closed with the host. Without
    ``detokenize`` the host renders no text (a suffix opening ``<think>`` is not detected);
    without ``embedder`` (a factory) it cannot embed.
    """

    def __init__(self, engine: Engine, base_manifest: ContextManifest, *,
                 tokenize: Callable[[str, bool], list[int]] | None = None,
                 detokenize: Callable[[list[int]], str] | None = None, add_bos: bool = True,
                 sampling: SamplingParams | None = None, owned: tuple[Any, ...] = (),
                 embedder: Callable[[], Embedder] | None = None) -> None:
        self.engine = engine
        self.base_manifest = base_manifest
        self.n_ctx = engine.backend.n_ctx_seq
        self.sampling = sampling or engine.config.sampling
        self.add_bos = add_bos
        self._tokenize = tokenize
        self._detokenize = detokenize
        self._embeddings = LazyEmbedder(embedder)
        self._owned = owned

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """Tokenize with the host's tokenizer."""
        if self._tokenize is None:
            raise UnsupportedFeatureError("text_input", "this host has no tokenizer; pass "
                                          "token_ids")
        return self._tokenize(text, add_special)

    def detokenize(self, token_ids: list[int]) -> str:
        """Token ids to text with the host's detokenizer ("" without one)."""
        return self._detokenize(token_ids) if self._detokenize is not None else ""

    def lease(self, scope: str | None, identity: str, timeout: float) -> int:
        """Lease a slot, ticking the engine until one is free or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            lease_id = self.engine.lease(scope, identity)
            if lease_id is not None:
                return lease_id
            if not self.engine.tick() and time.monotonic() >= deadline:
                raise LeaseTimeoutError(f"no slot could be leased within {timeout} s")

    def release(self, lease_id: int) -> None:
        """End the lease."""
        self.engine.release(lease_id)

    def submit(self, request: Request) -> None:
        """Submit to the engine (errors raise here, changing nothing)."""
        self.engine.submit(request)

    def wait(self, events: EventQueue, timeout: float) -> Event:
        """Tick until the request has an event."""
        deadline = time.monotonic() + timeout
        while events.events.empty():
            if not self.engine.tick() or time.monotonic() > deadline:
                raise RequestTimeoutError("the engine stalled before the session's event")
        return events.events.get_nowait()

    def cancel(self, request_id: Any) -> None:
        """Cancel a request."""
        self.engine.cancel(request_id)

    def call(self, fn: Callable[[Engine], T]) -> T:
        """Run ``fn(engine)`` now (this thread owns the engine)."""
        return fn(self.engine)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embeddings with the host's embedder factory."""
        return self._embeddings.embed(texts)

    def close(self) -> None:
        """Close the embedder, then what the host owns (a private context, adapters), last
        first."""
        self._embeddings.close()
        for obj in reversed(self._owned):
            obj.close()
