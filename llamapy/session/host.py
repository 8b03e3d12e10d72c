"""Where a session runs: a runtime that owns the engine, plus what the session needs of the
model (tokenizer, manifest, embeddings).

- :class:`ServerHost`: a shared ``Server``'s runtime; the session batches with everyone else.
- :class:`InlineHost`: an engine ticked in the caller's thread (tests on the fake backend).
- Standalone sessions (:func:`~llamapy.session.standalone.open_standalone`) are a
  :class:`ServerHost` on a private tick thread that the host owns and closes.

A session never touches the engine's backend: every KV operation goes through the runtime to
the engine's lease operations (:mod:`llamapy.engine.leases`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from llamapy import __version__
from llamapy._pins import LLAMA_CPP_COMMIT
from llamapy.adapters import AdapterSet
from llamapy.embeddings import Embedder
from llamapy.engine.engine import Engine
from llamapy.engine.media import MediaPrompt
from llamapy.engine.options import SamplingParams
from llamapy.errors import UnsupportedFeatureError
from llamapy.media.checks import check_physical_batch, no_projector
from llamapy.options.context import KV_RUNTIME_KEYS
from llamapy.options.limits import RequestLimits
from llamapy.runtime import InlineRuntime, MediaEncoding, ModelInfo, Runtime
from llamapy.session.manifest import ContextManifest, file_digest, runtime_digest, sha256_hex

if TYPE_CHECKING:
    from llamapy._native import LoraAdapter

__all__ = ["InlineHost", "LazyEmbedder", "ServerHost", "SessionHost", "model_manifest",
           "runtime_of"]

#: Context options that change what the KV holds (the runtime part of the manifest).
RUNTIME_KEYS = KV_RUNTIME_KEYS


class SessionHost(Protocol):
    """What a :class:`~llamapy.session.Session` runs on."""

    runtime: Runtime
    n_ctx: int
    sampling: SamplingParams
    base_manifest: ContextManifest
    add_bos: bool
    adapter_set: AdapterSet

    def tokenize(self, text: str, add_special: bool) -> list[int]: ...

    def media_prompt(self, text: str, media: Sequence[bytes],
                     add_special: bool) -> MediaPrompt: ...

    def detokenize(self, token_ids: list[int]) -> str: ...

    def embed(self, texts: list[str]) -> np.ndarray: ...

    def close(self) -> None: ...


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
            self._embedder = None


def model_manifest(model: ModelInfo, runtime: dict[str, Any],
                   adapters: tuple[tuple[str, float], ...] = ()) -> ContextManifest:
    """The base manifest (no segments) of a model under ``runtime`` settings."""
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
    """A session on a runtime hosting a native model: the session's requests batch with the
    runtime's other traffic, under the session's adapter set (already resolved).

    ``context`` is the hosting context's options (for the manifest and the embedder's thread
    count). ``owned`` are closed with the host, after the embedder (a standalone session's
    private runtime). ``media`` is the served model's media encoder (None: no projector),
    ``limits`` bound the media a suffix may send.
    """

    def __init__(self, runtime: Runtime, model: ModelInfo, context: Any, sampling: SamplingParams,
                 adapter_set: AdapterSet, owned: tuple[Any, ...] = (), *,
                 media: MediaEncoding | None = None,
                 limits: RequestLimits | None = None) -> None:
        self.runtime = runtime
        self.model = model
        self._media, self._limits, self._n_ubatch = media, limits or RequestLimits(), \
            context.n_ubatch
        self.sampling = sampling
        self.adapter_set = adapter_set
        self.add_bos = model.add_bos
        self.n_ctx = runtime.call(lambda engine: engine.n_ctx_seq)
        digests = tuple((file_digest(path), scale) for path, scale in adapter_set)
        self.base_manifest = model_manifest(model, runtime_of(context, self.n_ctx), digests)
        self._adapters: list[LoraAdapter] = []
        self._embeddings = LazyEmbedder(lambda: self._embedder(context.n_threads))
        self._owned = owned

    def _embedder(self, n_threads: int) -> Embedder:
        """The session's embedder, with the session's adapters (its own handles on them)."""
        from llamapy._native import LoraAdapter, Model

        model = self.model
        if not isinstance(model, Model):
            raise UnsupportedFeatureError("embed", "embeddings need a native model")
        self._adapters = [LoraAdapter(model, path) for path, _ in self.adapter_set]
        pairs = [(a, scale) for a, (_, scale) in zip(self._adapters, self.adapter_set,
                                                      strict=True)]
        return Embedder(model, n_threads=n_threads, adapters=pairs)

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """Tokenize with the served model (special tokens parsed)."""
        return self.model.tokenize(text, add_special, True)

    def media_prompt(self, text: str, media: Sequence[bytes],
                     add_special: bool) -> MediaPrompt:
        """``text`` with ``media`` (see :meth:`llamapy.server.Server.media_prompt`)."""
        if self._media is None:
            raise no_projector()
        prompt = self._media.prompt(text, media, self._limits, add_special=add_special,
                                    max_tokens=self.n_ctx)
        return check_physical_batch(prompt, self._n_ubatch)

    def detokenize(self, token_ids: list[int]) -> str:
        """Token ids to text (special tokens rendered)."""
        return self.model.detokenize(token_ids, False, True)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embeddings of the session's model under its adapters, on a private context."""
        return self._embeddings.embed(texts)

    def close(self) -> None:
        """Free the embedder and its adapters, then what the host owns."""
        self._embeddings.close()
        for adapter in self._adapters:
            adapter.close()
        self._adapters = []
        for obj in reversed(self._owned):
            obj.close()


class InlineHost:
    """A session on an engine ticked in the caller's thread (tests and simulations).

    Without ``detokenize`` the host renders no text (a suffix opening ``<think>`` is not
    detected); without ``tokenize`` it takes token ids only; it cannot embed.
    """

    def __init__(self, engine: Engine, base_manifest: ContextManifest, *,
                 tokenize: Callable[[str, bool], list[int]] | None = None,
                 detokenize: Callable[[list[int]], str] | None = None, add_bos: bool = True,
                 sampling: SamplingParams | None = None, adapter_set: AdapterSet = (),
                 media: MediaEncoding | None = None) -> None:
        self.runtime = InlineRuntime(engine)
        self.base_manifest = base_manifest
        self.n_ctx = engine.n_ctx_seq
        self.sampling = sampling or engine.config.sampling
        self.add_bos = add_bos
        self.adapter_set = adapter_set
        self._tokenize = tokenize
        self._detokenize = detokenize
        self._media = media

    def media_prompt(self, text: str, media: Sequence[bytes],
                     add_special: bool) -> MediaPrompt:
        """``text`` with ``media``, by the host's media encoder (``media``: a
        :class:`~llamapy.media.FakeMediaEncoder` in tests)."""
        if self._media is None:
            raise no_projector()
        return self._media.prompt(text, media, RequestLimits(), add_special=add_special)

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """Tokenize with the host's tokenizer."""
        if self._tokenize is None:
            raise UnsupportedFeatureError("text_input", "this host has no tokenizer; pass "
                                          "token_ids")
        return self._tokenize(text, add_special)

    def detokenize(self, token_ids: list[int]) -> str:
        """Token ids to text with the host's detokenizer ("" without one)."""
        return self._detokenize(token_ids) if self._detokenize is not None else ""

    def embed(self, texts: list[str]) -> np.ndarray:
        """Not available on an inline host."""
        raise UnsupportedFeatureError("embeddings", "this session host has no model to embed "
                                      "with")

    def close(self) -> None:
        """Nothing to free (the engine is the caller's)."""
