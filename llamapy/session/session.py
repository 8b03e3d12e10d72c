"""``Session``: a workspace session on one leased slot (see ``../shared/seeds``, issue 6).

The hot loop: :meth:`Session.ensure_prefix` keeps the stable prefix's KV hot (token-level LCP
reuse, only the divergent tail is prefilled), :meth:`Session.prefill_suffix` adds the volatile
tail, :meth:`Session.decode` streams the answer. Every primitive runs as an engine request on
the session's leased slot, so it batches with other traffic in the server's tick.

Resident tokens are ``prefix + suffix + generated`` (the KV may lack the last generated token).
Overflow is checked before anything changes; a failed prefill makes the session fatal.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np

from llamapy.engine.leases import LeaseState
from llamapy.engine.options import RequestOptions
from llamapy.engine.prefix import common_prefix
from llamapy.engine.request import (
    CacheKey,
    DoneEvent,
    ErrorEvent,
    Request,
    RequestTimings,
)
from llamapy.errors import (
    ContextOverflowError,
    InvalidOptionError,
    LlamapyError,
    ManifestMismatchError,
    QueueFullError,
    SessionBusyError,
    SessionClosedError,
    SessionFatalError,
)
from llamapy.runtime import RequestStream, new_request_id
from llamapy.session.config import (
    ContextReport,
    DecodeConfig,
    PrefixInput,
    PrefixStatus,
    SessionConfig,
    StreamChunk,
    SuffixInput,
    SuffixStatus,
)
from llamapy.session.host import SessionHost
from llamapy.session.inputs import as_decode_config, as_prefix, as_suffix, tokenize_prefix
from llamapy.session.manifest import ContextManifest
from llamapy.session.snapshot import SessionSnapshot
from llamapy.session.streams import DecodeStreams

__all__ = ["Session"]

#: Errors an engine raises at submission, changing nothing (the session stays usable).
_SUBMIT_ERRORS = (InvalidOptionError, ContextOverflowError, QueueFullError)


class Session(DecodeStreams):
    """A persistent workspace session holding one leased slot. Use as a context manager.

    Not for concurrent use from several threads; a primitive called while a decode stream is
    open raises :class:`SessionBusyError`. A decode stream closed early (or whose task was
    cancelled) cancels the rest; the tokens it had generated stay resident.
    """

    def __init__(self, host: SessionHost, config: SessionConfig | None = None) -> None:
        self.config = config or SessionConfig()
        self._host = host
        self._runtime = host.runtime
        self._manifest = host.base_manifest
        key = CacheKey(self.config.cache_scope, self._manifest.identity_digest, host.adapter_set)
        self._lease = self._runtime.lease(key, self.config.lease_timeout)
        self._prefix: list[int] = []
        self._suffix: list[int] = []
        self._generated: list[int] = []
        self._closed = False
        self._fatal: BaseException | None = None
        self._busy = False
        self._stale = False
        self.num_prefill_calls = 0
        self.num_prefill_tokens = 0
        self.num_decode_tokens = 0

    # --- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the lease (its KV stays as a cached prefix in the session's scope);
        idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._runtime.release(self._lease)
        finally:
            self._host.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed:
            raise SessionClosedError("session is closed")
        if self._fatal is not None:
            raise SessionFatalError("session is fatal after a failed operation; close and "
                                    "reopen it") from self._fatal
        if self._busy:
            raise SessionBusyError("a decode stream of this session is still open")
        if self._stale:
            self._sync_generated()

    @property
    def n_ctx(self) -> int:
        """Per-sequence context limit."""
        return self._host.n_ctx

    @property
    def base_manifest(self) -> ContextManifest:
        """The host's manifest (no segments); derive declared manifests from it."""
        return self._host.base_manifest

    @property
    def manifest(self) -> ContextManifest:
        """The manifest of the resident state."""
        return self._manifest

    @property
    def resident(self) -> list[int]:
        """Prefix, suffix and generated tokens."""
        return self._prefix + self._suffix + self._generated

    # --- the primitives -----------------------------------------------------------------------
    def ensure_prefix(self, prefix: PrefixInput | str | Sequence[int]) -> PrefixStatus:
        """Make the resident state equal ``prefix`` (a :class:`PrefixInput`, text or token
        ids): reuse the longest matching resident token prefix (same identity only), drop the
        rest (suffix and generated tokens included), prefill the divergent tail."""
        prefix = as_prefix(prefix)
        self._check()
        tokens, manifest = tokenize_prefix(self._host, prefix)
        same = manifest.identity_digest == self._manifest.identity_digest
        old = self.resident
        reusable = common_prefix(old, tokens) if same else 0
        if len(tokens) > self.n_ctx:
            raise ContextOverflowError(stage="ensure_prefix", resident_tokens=reusable,
                                       additional_tokens=len(tokens) - reusable, n_ctx=self.n_ctx)
        if not same:
            self._wipe(manifest.identity_digest)
        timings = self._prefill(tokens, manifest)
        self._manifest = manifest
        self._prefix, self._suffix, self._generated = tokens, [], []
        reused = timings.reused_tokens
        return PrefixStatus(prefix_tokens=len(tokens), reused_tokens=reused,
                            prefilled_tokens=timings.prefill_tokens,
                            dropped_tokens=len(old) - min(reused, len(old)), cold=not same,
                            timings=timings)

    def prefill_suffix(self, suffix: SuffixInput | str | Sequence[int]) -> SuffixStatus:
        """Prefill ``suffix`` (a :class:`SuffixInput`, text or token ids) after the stable
        prefix, which stays untouched; a previous suffix and generated tokens are replaced.

        The suffix is prefilled under its manifest (default: the session's); one whose
        identity differs from the resident KV's is refused with ``ManifestMismatchError``.
        """
        suffix = as_suffix(suffix)
        self._check()
        if suffix.manifest is not None:
            self._manifest.compare(suffix.manifest)
        tokens = list(suffix.token_ids) if suffix.token_ids is not None else \
            self._host.tokenize(suffix.text or "", False)
        n_prefix = len(self._prefix)
        if n_prefix + len(tokens) > self.n_ctx:
            raise ContextOverflowError(stage="prefill_suffix", resident_tokens=n_prefix,
                                       additional_tokens=len(tokens), n_ctx=self.n_ctx)
        old = self.resident
        timings = self._prefill(self._prefix + tokens, self._manifest)
        self._suffix, self._generated = tokens, []
        reused = max(0, timings.reused_tokens - n_prefix)
        return SuffixStatus(suffix_tokens=len(tokens), reused_tokens=reused,
                            prefilled_tokens=timings.prefill_tokens,
                            dropped_tokens=len(old) - n_prefix - reused, timings=timings)

    def decode(self, config: DecodeConfig | None = None, **fields: Any) -> Iterator[StreamChunk]:
        """Stream the answer from the resident state (validated now, run while iterated).

        Takes a :class:`DecodeConfig` and/or its fields as keywords (``max_tokens=32``).
        Generated tokens stay resident: a second ``decode`` continues after them. Closing the
        iterator early cancels the rest. An engine failure ends the stream with a chunk whose
        ``error`` is set, and the session turns fatal (so does a timeout, which also cancels
        the request).
        """
        request, run = self._decode_request(as_decode_config(config, fields))
        return self._stream(request, run)

    def adecode(self, config: DecodeConfig | None = None, **fields: Any
                ) -> AsyncIterator[StreamChunk]:
        """Async :meth:`decode` (validated now). No thread per stream: events reach the event
        loop from the engine's thread; closing the iterator or cancelling the task that reads
        it cancels the rest."""
        request, run = self._decode_request(as_decode_config(config, fields))
        return self._astream(request, run)

    def embed(self, text: str | Sequence[str]) -> np.ndarray:
        """Mean-pooled, L2-normalised float32 embeddings of the session's model (with its
        adapters): ``(n_embd,)`` for a string, ``(n, n_embd)`` for a list, computed in batches
        on a private embeddings context (made on first use) that never touches the KV."""
        if self._closed:
            raise SessionClosedError("session is closed")
        if isinstance(text, str):
            return self._host.embed([text])[0]
        return self._host.embed(list(text))

    # --- observability, snapshots -------------------------------------------------------------
    def explain_context(self) -> ContextReport:
        """The resident context and the session's counters (allowed after close/fatal)."""
        if self._stale and not self._closed and self._fatal is None:
            self._sync_generated()
        stable = hashlib.sha256(",".join(map(str, self._prefix)).encode()).hexdigest()
        n = len(self.resident)
        return ContextReport(
            resident_tokens=n, prefix_tokens=len(self._prefix), suffix_tokens=len(self._suffix),
            generated_tokens=len(self._generated), n_ctx=self.n_ctx,
            available_tokens=self.n_ctx - n, stable_token_hash=stable,
            manifest_digest=self._manifest.identity_digest, manifest=self._manifest,
            closed=self._closed, fatal=self._fatal is not None,
            num_prefill_calls=self.num_prefill_calls, num_prefill_tokens=self.num_prefill_tokens,
            num_decode_tokens=self.num_decode_tokens)

    def snapshot(self) -> SessionSnapshot:
        """The resident state: KV bytes of the session's sequence plus its tokens."""
        self._check()
        lease = self._lease
        state = self._runtime.call(lambda engine: engine.leases.snapshot(lease))
        resident, kv = self.resident, list(state.token_ids)
        assert kv == resident[:len(kv)] and len(resident) - len(kv) <= 1, "KV out of sync"
        return SessionSnapshot(state=state.state, token_ids=tuple(resident),
                               kv_tokens=len(kv), prefix_tokens=len(self._prefix),
                               suffix_tokens=len(self._suffix), n_ctx=self.n_ctx,
                               manifest=self._manifest)

    def restore(self, snapshot: SessionSnapshot) -> None:
        """Replace the resident state with ``snapshot``.

        Compatibility is judged on what the session can verify (model, tokenizer, runtime,
        adapters) and ``n_ctx``: ``ManifestMismatchError``, changing nothing, otherwise. The
        snapshot's declared fields (chat template, BOS policy) become the session's. A failed
        native restore is fatal.
        """
        self._check()
        self._host.base_manifest.check_verified(snapshot.manifest)
        if snapshot.n_ctx != self.n_ctx:
            raise ManifestMismatchError("n_ctx", self.n_ctx, snapshot.n_ctx)
        lease, identity = self._lease, snapshot.manifest.identity_digest
        state = LeaseState(snapshot.state, tuple(snapshot.token_ids[:snapshot.kv_tokens]))
        if not self._runtime.call(lambda engine: engine.leases.restore(lease, state, identity)):
            self._prefix, self._suffix, self._generated = [], [], []
            self._fatal = LlamapyError("state_seq_set failed")
            raise SessionFatalError("restoring the snapshot failed; the session is fatal")
        tokens, p, s = list(snapshot.token_ids), snapshot.prefix_tokens, snapshot.suffix_tokens
        self._prefix, self._suffix, self._generated = tokens[:p], tokens[p:p + s], tokens[p + s:]
        self._manifest = snapshot.manifest

    def save_snapshot(self, name: str) -> bool:
        """Write :meth:`snapshot` into the server's disk prompt cache under ``name`` (atomic,
        checksummed; counted in its budget and evicted least-recently-used like its other
        entries). False when the server has no disk cache or the snapshot exceeds its budget."""
        data = self.snapshot().to_bytes()
        store = self._runtime.call(lambda engine: engine.disk)
        return bool(store.save_blob(name, data))

    def load_snapshot(self, name: str) -> bool:
        """:meth:`restore` the snapshot saved under ``name`` by :meth:`save_snapshot` (on any
        server sharing the folder); False, changing nothing, when there is none (never saved,
        evicted, or corrupt). Raises as :meth:`restore` does for an incompatible snapshot."""
        self._check()
        store = self._runtime.call(lambda engine: engine.disk)
        data = store.load_blob(name)
        if data is None:
            return False
        self.restore(SessionSnapshot.from_bytes(data))
        return True

    def next_token_logits(self) -> np.ndarray:
        """Logits for the token after the resident state (a copy), leaving the KV as it was
        (the last resident token is recomputed by the engine)."""
        self._check()
        resident, lease = self.resident, self._lease
        if not resident:
            raise InvalidOptionError("no resident tokens", option="prefix")
        logits = self._runtime.call(
            lambda engine: engine.leases.next_token_logits(lease, resident))
        return np.array(logits, dtype=np.float32, copy=True)

    # --- internals ----------------------------------------------------------------------------
    def _wipe(self, identity: str) -> None:
        """Drop the resident KV and re-file the slot under ``identity`` (a new manifest
        identity must never reuse KV, whatever the engine's reuse paths would do)."""
        lease = self._lease
        self._runtime.call(lambda engine: engine.leases.clear(lease, identity))
        self._prefix, self._suffix, self._generated = [], [], []

    def _request(self, tokens: list[int], max_tokens: int, identity: str,
                 sampling: Any = None, speculative: Any = None) -> Request:
        options = RequestOptions(max_tokens=max_tokens, cache_scope=self.config.cache_scope,
                                 adapters=self._host.adapter_set, speculative=speculative,
                                 **({} if sampling is None else {"sampling": sampling}))
        return Request(request_id=new_request_id(), token_ids=tokens, options=options,
                       cache_identity=identity, lease_id=self._lease)

    def _prefill(self, tokens: list[int], manifest: ContextManifest) -> RequestTimings:
        request = self._request(tokens, 0, manifest.identity_digest)
        self.num_prefill_calls += 1
        stream = RequestStream(self._runtime, request, self.config.request_timeout)
        try:
            for _ in stream:
                pass
        except LlamapyError as exc:
            final = stream.final
            if isinstance(exc, _SUBMIT_ERRORS) and isinstance(final, ErrorEvent) and \
                    final.timings.prefill_tokens == 0:
                raise  # rejected before anything changed: the session stays usable
            self._fatal = exc  # a failed or stalled prefill: the KV state is unknown
            raise SessionFatalError(f"prefill failed: {exc}") from exc
        assert isinstance(stream.final, DoneEvent), "prefill ended without a final event"
        self.num_prefill_tokens += stream.final.timings.prefill_tokens
        return stream.final.timings
