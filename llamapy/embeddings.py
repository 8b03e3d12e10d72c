"""``Embedder``: pooled, L2-normalised float32 embeddings of a loaded ``Model``.

Pooling is ``mean`` (the default), ``cls`` (the first token's vector) or ``last`` (the last
token's, for decoder-only embedding models). An embeddings context (``embeddings=True``, that
pooling, unified KV) is private to the
embedder and is only ever touched by the embedder's own single worker thread: it is created
there on first use and freed there by :meth:`Embedder.close`. Inputs are batched: as many
sequences as fit ``n_ctx`` tokens and ``n_seq_max`` sequences go into one decode (each
sequence must fit one ubatch for pooling, so ``n_batch == n_ubatch == n_ctx``). An input
with images or audio (a :class:`~llamapy.engine.media.MediaPrompt`) is decoded alone, its text
and media rows in order; as in llama-server, its vector pools the rows of its last part (which
attend to everything before them).

The generation context of a ``Server`` or a session is never used; both share the ``Model``
(weights are loaded once). LoRA ``adapters`` (``(LoraAdapter, scale)`` pairs the caller owns and
keeps alive) can be attached to the embeddings context.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from llamapy._native import Batch, Context, EmbeddingBatch, LoraAdapter, Model
from llamapy.engine.media import MediaPrompt
from llamapy.errors import (
    ClosedError,
    ContextOverflowError,
    InvalidOptionError,
    QueueFullError,
    RequestCancelledError,
    UnsupportedFeatureError,
)
from llamapy.runtime.model_info import ModelInfo

if TYPE_CHECKING:
    import numpy as np

__all__ = ["POOLINGS", "RANK", "Embedder", "rerank_tokens"]

T = TypeVar("T")
#: Work for the embedder's thread: it reads the flag that cancels it between decodes.
Job = Callable[[threading.Event], T]

#: The poolings an ``Embedder`` applies (llama.cpp's names; ``none`` gives no vector per input).
POOLINGS = ("mean", "cls", "last")
#: The pooling of a reranker: its classifier head scores each input (:meth:`Embedder.scores`).
RANK = "rank"


def rerank_tokens(model: ModelInfo, query: str, document: str,
                  query_tokens: Sequence[int] | None = None) -> list[int]:
    """A (query, document) pair as a reranker reads it: the model's ``rerank`` template with
    ``{query}`` and ``{document}`` filled in when it has one, else BOS, the query, EOS, SEP,
    the document and EOS, each special token where the vocabulary adds it (as llama-server
    builds it). ``query_tokens``: the query already tokenized (no special tokens), for the
    pairs of one query."""
    template = model.chat_template("rerank")
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", document)
        return model.tokenize(text, False, True)
    eos = model.eos if model.eos >= 0 else model.sep
    out = [model.bos] if model.add_bos else []
    out += model.tokenize(query, False, False) if query_tokens is None else query_tokens
    out += [eos] if model.add_eos else []
    out += [model.sep] if model.add_sep else []
    out += model.tokenize(document, False, False)
    return out + ([eos] if model.add_eos else [])


class Embedder:
    """Embeddings of one model on a private context and worker thread (a context manager).

    ``embed(text)`` gives a ``(n_embd,)`` vector, ``embed([texts])`` an ``(n, n_embd)`` matrix;
    rows are L2-normalised float32. Safe to call from any thread; calls run one at a time, and
    at most ``max_pending`` wait besides the running one (0: no bound; past it a call raises
    :class:`~llamapy.errors.QueueFullError` at once). Cancelling the task awaiting an ``a*``
    call cancels its work: queued, it never runs; running, it stops before its next decode.
    ``pooling``: one of :data:`POOLINGS`.
    """

    def __init__(self, model: ModelInfo, *, n_ctx: int = 2048, n_seq_max: int = 16,
                 n_threads: int = 0, adapters: Sequence[tuple[LoraAdapter, float]] = (),
                 pooling: str = "mean", max_pending: int = 16) -> None:
        if n_ctx < 1 or n_seq_max < 1:
            raise InvalidOptionError("n_ctx and n_seq_max must be >= 1", option="n_ctx")
        if pooling not in (*POOLINGS, RANK):
            raise InvalidOptionError(f"pooling must be one of {(*POOLINGS, RANK)}, got "
                                     f"{pooling!r}", option="pooling")
        self.pooling = pooling
        self.model = model
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.n_threads = n_threads
        self.adapters = tuple(adapters)
        self._ctx: Context | None = None
        self._batch: Batch | None = None
        self._media_batch: EmbeddingBatch | None = None
        self._closed = False
        self.max_pending = max_pending
        self._jobs = 0
        self._jobs_lock = threading.Lock()
        self._worker_thread: threading.Thread | None = None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="llamapy-embed",
                                          initializer=self._mark_worker)

    @property
    def n_embd(self) -> int:
        """Width of the vectors."""
        return self.model.n_embd

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # --- public API ---------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """``text`` as the model tokenizes an embedding input (BOS as the model wants, special
        tokens not parsed)."""
        return self.model.tokenize(text, True, False)

    def score_tokens(self, inputs: Sequence[Sequence[int]]) -> list[float]:
        """Each input's relevance score (pooling :data:`RANK`; blocks, runs on the
        embedder's thread): the first output of the model's classifier head, unnormalised."""
        return self._run(self._scorer(inputs))

    async def ascore_tokens(self, inputs: Sequence[Sequence[int]]) -> list[float]:
        """:meth:`score_tokens`, awaited; cancelling the task stops the scoring."""
        return await self._arun(self._scorer(inputs))

    def embed(self, text: str | Sequence[str]) -> np.ndarray:
        """One vector for a string, a matrix (one row per input) for a list of strings."""
        if isinstance(text, str):
            row: np.ndarray = self.embed_tokens([self.tokenize(text)])[0]
            return row
        return self.embed_tokens(self._texts_tokens(text))

    def embed_tokens(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """A ``(len(inputs), n_embd)`` float32 matrix of token lists (blocks; runs on the
        embedder's thread)."""
        return self._run(self._embedding(inputs))

    async def aembed(self, text: str | Sequence[str]) -> np.ndarray:
        """:meth:`embed`, awaited (the event loop is never blocked)."""
        if isinstance(text, str):
            row: np.ndarray = (await self.aembed_tokens([self.tokenize(text)]))[0]
            return row
        return await self.aembed_tokens(self._texts_tokens(text))

    async def aembed_tokens(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """:meth:`embed_tokens`, awaited; cancelling the task stops the embedding."""
        return await self._arun(self._embedding(inputs))

    def _texts_tokens(self, text: Sequence[str]) -> list[list[int]]:
        texts = list(text)
        if not all(isinstance(t, str) for t in texts):
            raise InvalidOptionError("embed takes a string or a list of strings", option="text")
        return [self.tokenize(t) for t in texts]

    def _embedding(self, inputs: Sequence[Sequence[int]]) -> Job[np.ndarray]:
        """The job embedding ``inputs`` (checked now, on the caller's thread)."""
        if self.pooling == RANK:
            raise InvalidOptionError("a reranker scores inputs (score_tokens), it gives no "
                                     "vectors", option="pooling")
        groups = self._groups(inputs)
        return lambda cancel: self._embed_groups(inputs, groups, cancel)

    def _scorer(self, inputs: Sequence[Sequence[int]]) -> Job[list[float]]:
        """The job scoring ``inputs`` (checked now, on the caller's thread)."""
        if self.pooling != RANK:
            raise InvalidOptionError("scores need a reranker's rank pooling", option="pooling")
        width = max(1, self._native().n_cls_out)  # (llama.cpp reads the first, as llama-server)
        groups = self._groups(inputs)
        return lambda cancel: [float(row[0]) for row in self._pooled(inputs, groups, width,
                                                                     cancel)]

    def close(self) -> None:
        """Free the context on its thread and stop the thread; idempotent. Calls queued
        before it still run; none is taken after it (``ClosedError``)."""
        with self._jobs_lock:  # (a call is queued whole before this, or refused after it)
            if self._closed:
                return
            self._closed = True
            freed = self._worker.submit(self._free)
        freed.result()
        self._worker.shutdown(wait=True)

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- worker side --------------------------------------------------------------------------
    def _mark_worker(self) -> None:
        self._worker_thread = threading.current_thread()

    def _run(self, job: Job[T]) -> T:
        """Run ``job`` on the worker and wait for it (directly when already there)."""
        if self._closed:
            raise ClosedError("the embedder is closed")
        if threading.current_thread() is self._worker_thread:
            return job(threading.Event())
        return self._submit(job)[0].result()

    async def _arun(self, job: Job[T]) -> T:
        """Await ``job`` on the worker; cancelling the awaiting task cancels the job (a job
        already running stops before its next decode)."""
        future, cancel = self._submit(job)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            cancel.set()
            future.cancel()
            raise

    def _submit(self, job: Job[T]) -> tuple[Future[T], threading.Event]:
        """Queue ``job`` for the worker with its cancel flag; ``QueueFullError`` when
        ``max_pending`` calls wait already (besides the running one)."""
        cancel = threading.Event()
        with self._jobs_lock:
            if self._closed:
                raise ClosedError("the embedder is closed")
            if self.max_pending and self._jobs > self.max_pending:
                raise QueueFullError(self.max_pending)
            self._jobs += 1
            future = self._worker.submit(job, cancel)
        future.add_done_callback(self._job_done)
        return future, cancel

    def _job_done(self, future: Future[Any]) -> None:
        with self._jobs_lock:
            self._jobs -= 1

    def _native(self) -> Model:
        """The model as libllama's own (a context needs it); ``UnsupportedFeatureError``
        for another (the fake backend's model)."""
        if not isinstance(self.model, Model):
            raise UnsupportedFeatureError("embeddings", "embeddings need a model loaded by "
                                          "libllama")
        return self.model

    def _context(self) -> tuple[Context, Batch]:
        if self._ctx is None:
            ctx = Context(self._native(), n_ctx=self.n_ctx, n_batch=self.n_ctx, n_ubatch=self.n_ctx,
                          n_seq_max=self.n_seq_max, embeddings=True, pooling_type=self.pooling,
                          kv_unified=True, n_threads=self.n_threads)
            try:
                if self.adapters:
                    ctx.set_adapters(self.adapters)
                self._batch = Batch(self.n_ctx)
            except BaseException:
                ctx.close()
                raise
            self._ctx = ctx
        assert self._batch is not None
        return self._ctx, self._batch

    #: Tokens per decode: the inputs of one decode attend to one another's rows (masked), so
    #: a decode's attention grows with the square of its tokens; past one physical batch
    #: (llama.cpp's default ``n_ubatch``) a larger decode costs more than two smaller ones.
    group_tokens = 512

    @property
    def max_input_tokens(self) -> int:
        """The longest input: ``n_ctx``, and no longer than the model was trained on (a model
        with learned positions, BERT's, has no position past it: llama.cpp would abort)."""
        trained = self.model.n_ctx_train
        return min(self.n_ctx, trained) if trained > 0 else self.n_ctx

    def _groups(self, inputs: Sequence[Sequence[int]]) -> list[list[int]]:
        """Indexes of ``inputs`` per decode: within :attr:`group_tokens` (an input longer than
        that alone) and ``n_seq_max``; an input past :attr:`max_input_tokens` is a
        ``ContextOverflowError``."""
        groups: list[list[int]] = [[]]
        used = 0
        longest = self.max_input_tokens
        budget = min(self.n_ctx, self.group_tokens)
        for index, ids in enumerate(inputs):
            if not ids:
                raise InvalidOptionError(f"input {index} has no tokens", option="text")
            if len(ids) > longest:
                raise ContextOverflowError(stage="embed", resident_tokens=0,
                                           additional_tokens=len(ids), n_ctx=longest)
            alone = _has_media(ids)
            if groups[-1] and (alone or used + len(ids) > budget
                               or len(groups[-1]) == self.n_seq_max):
                groups.append([])
                used = 0
            groups[-1].append(index)
            used += budget if alone else len(ids)  # (nothing joins an input with media)
        return [g for g in groups if g]

    def _pooled(self, inputs: Sequence[Sequence[int]], groups: list[list[int]],
                width: int, cancel: threading.Event) -> np.ndarray:
        """The pooled ``width`` floats of each input, one decode per group; a set ``cancel``
        stops before the next decode (``RequestCancelledError``)."""
        import numpy as np  # on first use: a server that never embeds never imports it

        ctx, batch = self._context()
        out = np.zeros((len(inputs), width), dtype=np.float32)
        try:
            for group in groups:
                if cancel.is_set():
                    raise RequestCancelledError("the embedding was cancelled")
                ctx.clear()
                batch.clear()
                if _has_media(inputs[group[0]]):
                    self._decode_parts(ctx, batch, inputs[group[0]])  # type: ignore[arg-type]
                    out[group[0]] = ctx.sequence_embeddings(0, width)
                    continue
                for seq_id, index in enumerate(group):
                    ids = list(inputs[index])  # pooling reads every row
                    batch.add(seq_id, 0, ids, logits_last=True, n_outputs=len(ids))
                ctx.decode(batch)
                for seq_id, index in enumerate(group):
                    out[index] = ctx.sequence_embeddings(seq_id, width)
        finally:
            ctx.clear()
        return out

    def _decode_parts(self, ctx: Context, batch: Batch, prompt: MediaPrompt) -> None:
        """Decode a prompt with media as sequence 0: its text and media parts in order, every
        row an output."""
        at = 0
        parts: list[tuple[int, int, Any]] = []
        for span in prompt.media:
            parts += [(at, span.start, None)] if span.start > at else []
            parts.append((span.start, span.end, span.chunk))
            at = span.end
        parts += [(at, len(prompt), None)] if at < len(prompt) else []
        for start, end, chunk in parts:
            if chunk is None:
                batch.clear()
                batch.add(0, start, list(prompt[start:end]), logits_last=True,
                          n_outputs=end - start)
                ctx.decode(batch)
                continue
            if self._media_batch is None or self._media_batch.width != chunk.width:
                self._media_batch = EmbeddingBatch(self.n_ctx, chunk.width)
            self._media_batch.clear()
            self._media_batch.add(0, start, chunk.rows(0, chunk.n_tokens), outputs=True)
            causal = ctx.causal_attn
            if not chunk.causal:  # (Gemma 3's rows see one another)
                ctx.set_causal_attn(False)
            try:
                ctx.decode(self._media_batch)
            finally:
                ctx.set_causal_attn(causal)

    def _embed_groups(self, inputs: Sequence[Sequence[int]], groups: list[list[int]],
                      cancel: threading.Event) -> np.ndarray:
        import numpy as np

        out = self._pooled(inputs, groups, self.n_embd, cancel)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        normalised: np.ndarray = np.divide(out, norms, out=out, where=norms > 0)
        return normalised

    def _free(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None


def _has_media(ids: Sequence[int]) -> bool:
    return isinstance(ids, MediaPrompt) and bool(ids.media)
