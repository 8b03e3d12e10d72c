"""The contract between the serving core and a model backend.

The engine is backend-agnostic: it only talks to an object satisfying :class:`Backend`.
``llamapy.engine.fake.backend.FakeBackend`` implements it in pure Python for tests and simulation;
the libllama backend implements it on ``llamapy._native``. The protocol is deliberately close to
libllama so that each method is one or two native calls:

=========================  ====================================================================
``decode``                 ``llama_decode`` on a batch built from a :class:`BatchPlan`
``new_sampler``            a ``llama_sampler_chain`` built from :class:`SamplingParams`
``seq_rm/cp/keep``         ``llama_memory_seq_rm`` / ``_seq_cp`` / ``_seq_keep``
``clear``                  ``llama_memory_clear``
``seq_pos_max``            ``llama_memory_seq_pos_max``
``state_seq_get/set``      ``llama_state_seq_get_data_ext`` / ``llama_state_seq_set_data_ext``
``state_seq_size``         ``llama_state_seq_get_size_ext``
``logits``                 ``llama_get_logits_ith`` (a row of the most recent decode)
``pooled``                 ``llama_get_embeddings_seq`` (a sequence's pooled output)
``token_to_piece``         ``llama_token_to_piece`` (special tokens not rendered)
``is_eog``                 ``llama_vocab_is_eog``
=========================  ====================================================================

Media (see :mod:`llamapy.engine.media`): a :class:`Segment` with ``media`` set holds rows of
an encoded image or audio clip, not text: its ``token_ids`` are the chunk's media token ids
(negative), and the backend decodes the chunk's embeddings for them before the batch of tokens
(``llama_batch.embd``): the causal chunks' rows in one batch, each other chunk (whole) in one
of its own with bidirectional attention. Media segments take no rows of the token batch and
never ask for logits. ``n_batch`` bounds each of these decodes (:meth:`BatchPlan.decodes`).

Pooling: a backend whose context pools (:attr:`Backend.pools`: a reranker's classifier, an
embedding model) gives one output per sequence, not logits. The engine then decodes each
request's whole prompt in one ``decode``, every row an output (``n_outputs`` = its length), and
reads :meth:`Backend.pooled` right after it; such a decode holds at most ``n_ubatch`` tokens (one
physical batch: an encoder attends across it, and a pooled sequence must not span two).

Policy (which tokens to decode, which prefix to keep) lives in the engine, never in a backend.

Adapter sets: llama.cpp applies LoRA adapters to a whole context, not per sequence, so every
:class:`BatchPlan` carries one ``adapter_set`` (an opaque hashable; ``()`` = the base model) and
the backend applies it before decoding (``llama_set_adapters_lora``, only when it differs from
the set already applied). The engine guarantees that all of a plan's segments belong to runs of
that set and that they only attend to KV computed under it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from llamapy.engine.media import MediaRows
    from llamapy.engine.options import SamplingParams

__all__ = ["Backend", "BatchPlan", "Sampler", "Segment"]


@dataclass(slots=True, frozen=True)
class Segment:
    """Consecutive tokens of one sequence in a batch.

    The tokens occupy positions ``start_pos .. start_pos + len(token_ids) - 1`` of sequence
    ``seq_id``; ``start_pos`` is always ``seq_pos_max(seq_id) + 1`` (positions stay
    consecutive). ``logits=True`` asks for output rows for the segment's last ``n_outputs``
    tokens (1: the usual decode or last prefill chunk; more: a speculative draft's verification,
    one row per drafted position plus the bonus row). ``tag`` is an opaque label (the
    ``(cache_scope, cache_identity, adapter_set)`` of the request that owns the tokens); real
    backends ignore it, the fake backend records it in every KV cell it writes so tests can
    prove reuse never crosses scopes. ``draft_tag`` is the key of the text a speculative draft
    was proposed from (None: no draft); the fake backend records a violation when it differs
    from ``tag`` (a cross-scope proposal). ``media``: the segment decodes these rows of a media
    chunk (see the module docstring).
    """

    seq_id: int
    start_pos: int
    token_ids: Sequence[int]
    logits: bool = False
    tag: Hashable = None
    n_outputs: int = 1
    draft_tag: Hashable = None
    media: MediaRows | None = None


@dataclass(slots=True)
class BatchPlan:
    """One ``llama_decode`` call: segments laid out back to back in the batch.

    Text segment ``i`` occupies batch rows ``offsets[i] .. offsets[i] + len(token_ids) - 1``
    of the token batch (media segments take none: their offset is the next text row);
    :meth:`output_index` is the row of its last token, the index a backend passes to
    ``llama_sampler_sample`` / ``llama_get_logits_ith``. ``adapter_set`` is the one adapter set
    the whole call runs under (see the module docstring).
    """

    segments: list[Segment] = field(default_factory=list)
    adapter_set: Hashable = ()

    @property
    def n_tokens(self) -> int:
        """Total tokens in the batch (must be <= the backend's ``n_batch``)."""
        return sum(len(s.token_ids) for s in self.segments)

    def decodes(self) -> list[int]:
        """The rows of each decode the plan makes: the causal media rows (if any), each
        non-causal media segment, then the tokens."""
        causal, alone, text = 0, [], 0
        for seg in self.segments:
            if seg.media is None:
                text += len(seg.token_ids)
            elif seg.media.chunk.causal:
                causal += len(seg.token_ids)
            else:
                alone.append(len(seg.token_ids))
        return [n for n in (causal, *alone, text) if n]

    @property
    def offsets(self) -> list[int]:
        """Token-batch row of each segment's first token (media segments take no rows)."""
        out, at = [], 0
        for seg in self.segments:
            out.append(at)
            if seg.media is None:
                at += len(seg.token_ids)
        return out

    def output_index(self, segment_index: int) -> int:
        """Batch row of the last token of segment ``segment_index``."""
        seg = self.segments[segment_index]
        return self.offsets[segment_index] + len(seg.token_ids) - 1

    def output_indices(self) -> list[int | None]:
        """Per segment, the row of its output (``None`` when ``logits`` is False)."""
        out: list[int | None] = []
        for seg, off in zip(self.segments, self.offsets, strict=True):
            out.append(off + len(seg.token_ids) - 1 if seg.logits and seg.media is None
                       else None)
        return out


@runtime_checkable
class Sampler(Protocol):
    """A per-request sampler (a native sampler chain), created by :meth:`Backend.new_sampler`.

    Contract:

    - ``sample(i)`` draws a token from output row ``i`` of the *most recent* ``decode`` and
      **also accepts it** into the sampler's history (penalties, grammar, mirostat state), as
      ``llama_sampler_sample`` does. The engine never calls :meth:`accept` for sampled tokens.
    - ``accept(token_id)`` feeds a token that was *not* produced by :meth:`sample` (reserved for
      callers that replay history); the engine itself does not call it.
    - ``top_logprobs(i, n)`` may be called right after ``sample(i)`` (before the next decode):
      the ``n`` most likely tokens of row ``i`` as ``(token_id, log_probability)``, most likely
      first, computed from the raw logits (before sampling transforms).
    - ``token_logprob(i, token_id)``: that token's log-probability in row ``i`` (same basis as
      ``top_logprobs``); the engine asks for the sampled token when it is not in the top ``n``.
    - ``close()`` frees native resources; idempotent. The engine closes every sampler it got.
    """

    def sample(self, batch_index: int) -> int: ...

    def accept(self, token_id: int) -> None: ...

    def top_logprobs(self, batch_index: int, n: int) -> list[tuple[int, float]]: ...

    def token_logprob(self, batch_index: int, token_id: int) -> float: ...

    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """What the engine needs from a model + context. Not thread-safe; one owner thread.

    Sequences are numbered ``0 .. n_seq_max - 1``; the engine uses sequence ``i`` for slot ``i``.

    Errors: ``decode`` raises :class:`llamapy.errors.KVCacheFullError` when the KV cache has no
    room for the batch (and then changes nothing), :class:`~llamapy.errors.DecodeAbortedError`,
    :class:`~llamapy.errors.InvalidBatchError` or :class:`~llamapy.errors.DecodeError` otherwise
    (after which positions past each sequence's pre-decode end may be partially written; the
    engine trims them with ``seq_rm``). ``new_sampler`` raises
    :class:`~llamapy.errors.GrammarError` for a grammar that does not parse.
    """

    @property
    def n_ctx(self) -> int:
        """Total KV cells of the context."""
        ...

    @property
    def n_ctx_seq(self) -> int:
        """Per-sequence limit: ``n_ctx`` if ``kv_unified`` else ``n_ctx // n_seq_max``."""
        ...

    @property
    def n_seq_max(self) -> int:
        """Number of sequences (slots) the context was created with."""
        ...

    @property
    def n_batch(self) -> int:
        """Max tokens one ``decode`` accepts."""
        ...

    @property
    def n_ubatch(self) -> int:
        """Rows of one physical batch (a media chunk that is not causal must fit one)."""
        ...

    @property
    def media_width(self) -> int:
        """Floats in one media row (the model's input embedding width)."""
        ...

    @property
    def kv_unified(self) -> bool:
        """One KV buffer shared by all sequences (enables metadata-only ``seq_cp``)."""
        ...

    @property
    def pools(self) -> bool:
        """Whether the context pools each sequence into one output (see the module
        docstring): then every request the engine takes is pooled, and none samples."""
        ...

    @property
    def supports_partial_removal(self) -> bool:
        """False for recurrent/hybrid models: ``seq_rm`` of a strict sub-range then fails
        (unless a context checkpoint restored with ``state_seq_set(partial=True)`` stands at
        its start); the engine then keeps checkpoints."""
        ...

    @property
    def n_vocab(self) -> int:
        """Vocabulary size."""
        ...

    @property
    def async_decode(self) -> bool:
        """Whether ``decode`` returns before the step is computed (a device queue: reading
        an output row waits for it); the engine then does a step's text and events while the
        next step computes."""
        ...

    @property
    def adapter_set(self) -> Hashable:
        """The adapter set applied by the last ``decode`` (``()`` before any); the engine
        reads it instead of tracking the switch state a second time."""
        ...

    def decode(self, plan: BatchPlan) -> None:
        """Apply ``plan.adapter_set`` (if it is not the current one), then run the model on
        ``plan``; output rows are kept until the next ``decode``. A set the backend cannot apply
        raises ``DecodeError`` (the engine fails the batch's runs)."""
        ...

    def load_adapters(self, adapter_set: Hashable) -> None:
        """Make every adapter of ``adapter_set`` ready to apply (e.g. load its files); called
        by ``Engine.submit`` for each request with a non-empty set. Raises
        ``ModelLoadError`` / ``InvalidOptionError`` for a set it cannot use."""
        ...

    def new_sampler(self, params: SamplingParams) -> Sampler:
        """A fresh sampler for one request; raises ``GrammarError`` for a bad grammar.

        Unlike every other method it may be called from any thread, concurrently with the
        owner's (it reads only the model): the runtime builds costly samplers (a grammar's
        parse) off the tick thread. The sampler is then used on the tick thread only."""
        ...

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        """Remove positions ``[p0, p1)`` of ``seq_id`` (``p1 = -1``: to the end).

        Returns False (and changes nothing) when partial removal is unsupported. Removing a
        whole sequence (``p0 = 0, p1 = -1``) always succeeds.
        """
        ...

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Make ``dst`` share ``src``'s cells at positions ``[p0, p1)`` (metadata only when
        ``kv_unified``). The engine only calls it when ``kv_unified`` is True."""
        ...

    def seq_keep(self, seq_id: int) -> None:
        """Remove every sequence but ``seq_id``."""
        ...

    def clear(self) -> None:
        """Remove every cell of every sequence."""
        ...

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position stored for ``seq_id``; -1 when the sequence is empty."""
        ...

    def state_seq_get(self, seq_id: int, partial: bool = False) -> bytes:
        """Serialise ``seq_id``'s KV (all positions) to bytes. ``partial``: only the state
        that cannot be trimmed back (a recurrent or hybrid model's recurrent state, a
        sliding window): a context checkpoint of the sequence as it stands."""
        ...

    def state_seq_size(self, seq_id: int, partial: bool = False) -> int:
        """Exactly ``len(state_seq_get(seq_id, partial))``, computed without serialising (the
        RAM prompt cache checks its budget with it before asking for the bytes)."""
        ...

    def state_seq_set(self, seq_id: int, data: bytes, partial: bool = False) -> bool:
        """Replace ``seq_id``'s KV with ``data`` from :meth:`state_seq_get`.

        ``partial``: replace only the untrimmable state with a checkpoint's (the KV of the
        positions it covers must be in place); ``seq_rm`` of the positions after the
        checkpoint then succeeds. Returns False on failure (no room, corrupt data);
        ``seq_id`` is then empty.
        """
        ...

    def logits(self, batch_index: int) -> Sequence[float]:
        """The raw next-token logits (``n_vocab`` floats) of output row ``batch_index`` of the
        most recent ``decode``; valid until the next ``decode`` (copy it to keep it).
        ``IndexError`` when the row was not asked for."""
        ...

    def pooled(self, seq_id: int) -> Sequence[float]:
        """The pooled output of ``seq_id`` computed by the most recent ``decode`` (which held
        its whole sequence, every row an output): a reranker's scores, or an embedding.
        ``IndexError`` when that decode pooled no such sequence."""
        ...

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes a token renders to (may be a partial UTF-8 character; b"" for control
        tokens unless ``special``)."""
        ...

    def is_eog(self, token_id: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        ...
