"""``LlamaBackend``: the engine's :class:`~llamapy.engine.Backend` on libllama.

Each method is one or two native calls; no policy. Batches are filled in place in a
preallocated :class:`~llamapy._native.Batch`, so Python work per tick stays small next to the
decode itself. The samplers it builds are :mod:`llamapy.llama_sampler`'s.

LoRA: an adapter set is ``((path, scale), ...)``. :meth:`LlamaBackend.load_adapters` loads each
file once (cached by resolved path, shared by every set that names it); ``decode`` calls
``llama_set_adapters_lora`` only when a plan's set differs from the one applied last;
:meth:`LlamaBackend.close` frees the adapters.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import cast

from ._native import Batch, Context, EmbeddingBatch, LoraAdapter, Model
from .engine.backend import BatchPlan, Segment
from .engine.options import SamplingParams
from .errors import DecodeError, InvalidBatchError, InvalidOptionError, LlamapyError
from .greedy import greedy_pick_for
from .lazy_grammar import LazyGrammar
from .llama_sampler import LlamaSampler, build_chain, log_normalizer, top_logprobs
from .options.limits import fit_windows

__all__ = ["ADAPTER_ERROR_CODE", "LlamaBackend", "LlamaSampler", "build_chain", "log_normalizer",
           "top_logprobs"]

#: ``DecodeError.code`` when a plan's adapter set cannot be applied (the batch is invalid for
#: this context, as ``llama_decode``'s -1).
ADAPTER_ERROR_CODE = -1


class LlamaBackend:
    """The engine's backend on a native model and context (one owner thread)."""

    def __init__(self, model: Model, ctx: Context) -> None:
        self.model = model
        self.ctx = ctx
        self._batch = Batch(ctx.n_batch)
        self._media_batch: EmbeddingBatch | None = None  # made on the first media segment
        # (a sliding window cache of only the window cannot be cut back either)
        self._partial = not (model.is_recurrent
                             or (model.n_swa > 0 and not ctx.options.swa_full))
        self._adapters: dict[str, LoraAdapter] = {}
        self._adapter_set: Hashable = ()
        self._pooling = ctx.pooling
        self._async = model.computes_async

    # --- limits -------------------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        """Total KV cells."""
        return self.ctx.n_ctx

    @property
    def n_ctx_seq(self) -> int:
        """Per-sequence limit; for a context that pools, no more than the model was trained
        on (an encoder's learned positions end there: past them llama.cpp would abort)."""
        trained = self.model.n_ctx_train
        if self._pooling != "none" and trained > 0:
            return min(self.ctx.n_ctx_seq, trained)
        return self.ctx.n_ctx_seq

    @property
    def n_seq_max(self) -> int:
        """Sequences (slots)."""
        return self.ctx.n_seq_max

    @property
    def n_batch(self) -> int:
        """Max tokens per decode."""
        return self.ctx.n_batch

    @property
    def kv_unified(self) -> bool:
        """One KV buffer for all sequences."""
        return self.ctx.options.kv_unified

    @property
    def async_decode(self) -> bool:
        """Whether ``decode`` returns once the step is queued (layers on a GPU that computes
        asynchronously): the engine then does a token's text and event, and lays out the next
        steady step, while the step computes. False on a CPU, where a decode returns when its
        outputs are ready."""
        return self._async

    @property
    def pools(self) -> bool:
        """Whether the context pools each sequence (an embeddings context with a pooling)."""
        return self._pooling != "none"

    def pooled(self, seq_id: int) -> Sequence[float]:
        """The pooled output of ``seq_id`` from the last decode: a reranker's ``n_cls_out``
        scores (at least one), else an ``n_embd`` embedding."""
        width = max(1, self.model.n_cls_out) if self._pooling == "rank" else None
        try:
            return cast("Sequence[float]", self.ctx.sequence_embeddings(seq_id, width))
        except LlamapyError as exc:
            raise IndexError(str(exc)) from exc

    @property
    def supports_partial_removal(self) -> bool:
        """False for recurrent and hybrid models, and for sliding-window models whose window
        cache is not full-size (``swa_full`` off)."""
        return self._partial

    @property
    def n_vocab(self) -> int:
        """Vocabulary size."""
        return self.model.n_vocab

    @property
    def n_ubatch(self) -> int:
        """Rows of one physical batch."""
        return self.ctx.n_ubatch

    @property
    def media_width(self) -> int:
        """Floats in a media row (the model's input embedding width)."""
        return self.model.n_embd_inp

    # --- compute ------------------------------------------------------------------------------

    def decode(self, plan: BatchPlan) -> None:
        """Apply the plan's adapter set if it is not the current one, fill the preallocated
        batch from the plan's segments and decode it."""
        self._check(plan)
        if plan.adapter_set != self._adapter_set:
            self._apply_adapters(plan.adapter_set)
        media = [seg for seg in plan.segments if seg.media is not None]
        batch = self._batch
        batch.clear()
        for seg in plan.segments:
            if seg.media is None:
                batch.add(seg.seq_id, seg.start_pos, seg.token_ids, seg.logits, seg.n_outputs)
        try:
            if media:
                self._decode_media(media)
            self.ctx.decode(batch)
        except DecodeError:
            for seg in media:  # the plan failed as a whole: the media rows it wrote go too
                self.ctx.seq_rm(seg.seq_id, seg.start_pos, -1)
            raise

    def _decode_media(self, segments: list[Segment]) -> None:
        """Decode the plan's media segments from their embeddings, before its tokens: the
        causal ones together, each other one alone with bidirectional attention."""
        causal = [seg for seg in segments if seg.media and seg.media.chunk.causal]
        if causal:
            self.ctx.decode(self._fill_media(causal))
        for seg in segments:
            if seg.media and not seg.media.chunk.causal:
                batch = self._fill_media([seg])
                self.ctx.set_causal_attn(False)
                try:
                    self.ctx.decode(batch)
                finally:
                    self.ctx.set_causal_attn(True)

    def _fill_media(self, segments: list[Segment]) -> EmbeddingBatch:
        batch = self._media_batch
        if batch is None:
            batch = self._media_batch = EmbeddingBatch(self.ctx.n_batch, self.model.n_embd_inp)
        batch.clear()
        for seg in segments:
            assert seg.media is not None
            if seg.media.chunk.width != batch.width:
                raise InvalidBatchError()
            batch.add(seg.seq_id, seg.start_pos,
                      seg.media.chunk.rows(seg.media.first, len(seg.token_ids)))
        return batch
    def _check(self, plan: BatchPlan) -> None:
        """The contract's batch rules, checked before libllama sees the batch (it accepts a
        sequence that does not continue at ``pos_max + 1``; the engine never sends one)."""
        if self._pooling != "none" and plan.n_tokens > self.ctx.n_ubatch:
            raise InvalidBatchError()  # (an encoder's batch past a ubatch: llama.cpp asserts)
        if max(plan.decodes(), default=0) > self.ctx.n_batch or any(
                seg.media is not None and not seg.media.chunk.causal
                and len(seg.token_ids) > self.ctx.n_ubatch for seg in plan.segments):
            raise InvalidBatchError()  # (bidirectional rows past a ubatch: llama.cpp asserts)
        next_pos: dict[int, int] = {}
        for seg in plan.segments:
            if not 0 <= seg.seq_id < self.ctx.n_seq_max:
                raise InvalidBatchError()
            expected = next_pos.get(seg.seq_id)
            if expected is None:
                expected = self.ctx.seq_pos_max(seg.seq_id) + 1
            if seg.start_pos != expected:
                raise InvalidBatchError()
            next_pos[seg.seq_id] = expected + len(seg.token_ids)

    # --- LoRA adapters ------------------------------------------------------------------------

    @property
    def adapter_set(self) -> Hashable:
        """The adapter set applied to the context by the last ``decode``."""
        return self._adapter_set

    @property
    def loaded_adapters(self) -> tuple[str, ...]:
        """Resolved paths of the adapters loaded so far."""
        return tuple(sorted({str(a.path) for a in self._adapters.values()}))

    def load_adapters(self, adapter_set: Hashable) -> None:
        """Load every adapter of ``adapter_set`` not loaded yet (call it on the owner thread).

        Raises ``InvalidOptionError`` when the set is not ``((path, scale), ...)`` and
        ``ModelLoadError`` for a missing file or one that is no LoRA for this model.
        """
        for path, _ in _adapter_pairs(adapter_set):
            self._adapter(path)

    def _adapter(self, path: str) -> LoraAdapter:
        adapter = self._adapters.get(path)
        if adapter is None:
            resolved = str(Path(path).expanduser().resolve())
            adapter = self._adapters.get(resolved) or LoraAdapter(self.model, resolved)
            self._adapters[resolved] = self._adapters[path] = adapter
        return adapter

    def _apply_adapters(self, adapter_set: Hashable) -> None:
        try:
            pairs = [(self._adapter(p), s) for p, s in _adapter_pairs(adapter_set)]
            self.ctx.set_adapters(pairs)
        except LlamapyError as exc:
            raise DecodeError(ADAPTER_ERROR_CODE,
                              f"cannot apply adapter set {adapter_set!r}: {exc}") from exc
        self._adapter_set = adapter_set

    def close(self) -> None:
        """Detach (if the context is still open) and free the loaded adapters; idempotent.
        The context and the model stay their owner's."""
        if not self.ctx.closed:
            self.ctx.set_adapters([])
        for adapter in {id(a): a for a in self._adapters.values()}.values():
            adapter.close()
        self._adapters.clear()
        self._adapter_set = ()

    # --- sampling -----------------------------------------------------------------------------

    def new_sampler(self, params: SamplingParams) -> LlamaSampler:
        """A native chain for one request (``GrammarError`` for a bad grammar)."""
        lazy = LazyGrammar(self.model, params.grammar, params.grammar_root,
                           params.grammar_triggers) if params.grammar_triggers else None
        try:
            chain = build_chain(self.model, fit_windows(params, self.n_ctx_seq))
        except BaseException:
            if lazy is not None:
                lazy.close()
            raise
        pick = greedy_pick_for(chain.names, params.logit_bias, self.model.n_vocab)
        return LlamaSampler(chain, self.ctx, pick, lazy)

    # --- memory -------------------------------------------------------------------------------

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        """Remove ``[p0, p1)`` of a sequence."""
        return self.ctx.seq_rm(seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Share ``src``'s cells with ``dst``."""
        self.ctx.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        """Drop every other sequence."""
        self.ctx.seq_keep(seq_id)

    def clear(self) -> None:
        """Drop everything."""
        self.ctx.clear()

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of a sequence, -1 if empty."""
        return self.ctx.seq_pos_max(seq_id)

    def state_seq_get(self, seq_id: int, partial: bool = False) -> bytes:
        """Serialise a sequence's KV (``partial``: its untrimmable state, a checkpoint)."""
        return self.ctx.state_seq_get(seq_id, partial)

    def state_seq_size(self, seq_id: int, partial: bool = False) -> int:
        """Bytes :meth:`state_seq_get` would return, without serialising."""
        return self.ctx.state_seq_size(seq_id, partial)

    def state_seq_set(self, seq_id: int, data: bytes, partial: bool = False) -> bool:
        """Restore a sequence's KV (``partial``: a checkpoint); on failure the sequence is
        left empty."""
        if self.ctx.state_seq_set(seq_id, data, partial):
            return True
        self.ctx.seq_rm(seq_id, -1, -1)
        return False

    def logits(self, batch_index: int) -> Sequence[float]:
        """A zero-copy numpy view of a row's logits (valid until the next decode)."""
        return cast("Sequence[float]", self.ctx.logits(batch_index))

    # --- vocabulary ---------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """A token's bytes (special tokens rendered only when ``special``)."""
        return self.model.token_to_piece(token_id, special=special)

    def is_eog(self, token_id: int) -> bool:
        """End-of-generation token?"""
        return self.model.is_eog(token_id)


def _adapter_pairs(adapter_set: Hashable) -> list[tuple[str, float]]:
    """``adapter_set`` as ``[(path, scale), ...]``; ``InvalidOptionError`` if malformed."""
    if not isinstance(adapter_set, tuple):
        raise InvalidOptionError("adapters: expected a tuple of (path, scale)", option="adapters")
    pairs = []
    for item in adapter_set:
        ok = isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
        ok = ok and isinstance(item[1], int | float) and not isinstance(item[1], bool)
        if not ok or not math.isfinite(item[1]):
            raise InvalidOptionError(f"adapters: {item!r} is not a (path, scale) pair",
                                     option="adapters")
        pairs.append((item[0], float(item[1])))
    return pairs
