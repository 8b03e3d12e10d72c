"""``Session``: a workspace session on one leased slot.

The hot loop: :meth:`Session.ensure_prefix` keeps the stable prefix's KV hot (token-level LCP
reuse, only the divergent tail is prefilled), :meth:`Session.prefill_suffix` adds the volatile
tail, :meth:`Session.decode` streams the answer. Every primitive runs as an engine request on
the session's leased slot, so it batches with other traffic in the server's tick.

Resident tokens are ``prefix + suffix + generated`` (the KV may lack the last generated token).
Overflow is checked before anything changes. Every blocking primitive takes ``timeout=``, a
deadline for the whole call; :meth:`Session.cancel` stops the call in flight from another
thread or task. An interrupted prefill rolls back to the tokens already computed
(:mod:`llamapy.session.prefill`); the async twins live in :mod:`llamapy.session.aio`.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from llamapy.engine.cache.ram import common_prefix
from llamapy.engine.kv_ops import KvState
from llamapy.engine.media import MediaSpan
from llamapy.engine.options import RequestOptions
from llamapy.engine.request import CacheKey, Request, RequestTimings
from llamapy.errors import (
    ContextOverflowError,
    InvalidOptionError,
    LlamapyError,
    ManifestMismatchError,
    SessionBusyError,
    SessionClosedError,
    SessionFatalError,
)
from llamapy.runtime import new_request_id
from llamapy.session.aio import AsyncPrimitives
from llamapy.session.config import (
    ContextReport,
    DecodeConfig,
    PrefixInput,
    PrefixStatus,
    SessionConfig,
    SuffixInput,
    SuffixStatus,
)
from llamapy.session.host import SessionHost
from llamapy.session.inputs import as_decode_config, as_prefix, as_suffix, tokenize_prefix
from llamapy.session.lease import SessionLease
from llamapy.session.manifest import ContextManifest
from llamapy.session.prefill import PrefillPlan, Prefills, ProgressCallback
from llamapy.session.snapshot import SessionSnapshot
from llamapy.session.streams import AsyncDecodeStream, DecodeStream, DecodeStreams
from llamapy.session.watch import CallWatch

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from llamapy.engine.engine import Engine
    from llamapy.session.fields import DecodeFields

__all__ = ["Session", "prefix_status", "suffix_status"]


class Session(AsyncPrimitives, Prefills, DecodeStreams):
    """A persistent workspace session holding one leased slot. Use as a context manager.

    Not for concurrent use from several threads (but :meth:`cancel` is); a primitive called
    while a decode stream is open raises :class:`SessionBusyError`. A decode stream closed
    early (or whose task was cancelled) cancels the rest; the tokens it had generated stay
    resident. Every primitive has an ``a``-prefixed twin for coroutines (``aensure_prefix``,
    ...) and the session is an async context manager too.

    The lease ends with :meth:`close`; a session dropped without it releases its lease when it
    is garbage-collected, and a lease left unused for ``config.lease_idle_timeout`` seconds is
    reclaimed (the next primitive raises :class:`~llamapy.errors.LeaseExpiredError`): see
    :mod:`llamapy.session.lease`.
    """

    def __init__(self, host: SessionHost, config: SessionConfig | None = None) -> None:
        self.config = config or SessionConfig()
        self._host = host
        self._runtime = host.runtime
        self._manifest = host.base_manifest
        key = CacheKey(self.config.cache_scope, self._manifest.identity_digest, host.adapter_set)
        self._leased = SessionLease(self, self._runtime, key, self.config)
        self._lease = self._leased.lease_id
        self._prefix: list[int] = []
        self._suffix: list[int] = []
        self._generated: list[int] = []
        self._closed = False
        self._fatal: BaseException | None = None
        self._busy = False
        self._stale = False
        self._watch: CallWatch | None = None
        self.num_prefill_calls = 0
        self.num_prefill_tokens = 0
        self.num_decode_tokens = 0

    # --- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the lease (its KV stays as a cached prefix in the session's scope);
        idempotent, and quiet after the lease was reclaimed."""
        if self._closed:
            return
        self._closed = True
        try:
            self._leased.release()
        finally:
            self._host.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
    def ensure_prefix(self, prefix: PrefixInput | str | Sequence[int], *,
                      timeout: float | None = None,
                      on_progress: ProgressCallback | None = None) -> PrefixStatus:
        """Make the resident state equal ``prefix`` (a :class:`PrefixInput`, text or token
        ids): reuse the longest matching resident token prefix (same identity only), drop the
        rest (suffix and generated tokens included), prefill the divergent tail.

        ``timeout``: seconds for the whole call (``RequestTimeoutError`` past it);
        ``on_progress`` is called with each :class:`PrefillProgress`. An interrupted prefill
        (deadline, stall, :meth:`cancel`, an exception from ``on_progress``) leaves the
        tokens already computed resident as the prefix, so a retry resumes from them.
        """
        prefix = as_prefix(prefix)
        with self._call("ensure_prefix", timeout) as watch:
            plan = self._plan_prefix(prefix)
            timings = self._prefill(plan, watch, on_progress)
        return prefix_status(plan, timings)

    def prefill_suffix(self, suffix: SuffixInput | str | Sequence[int], *,
                       timeout: float | None = None,
                       on_progress: ProgressCallback | None = None) -> SuffixStatus:
        """Prefill ``suffix`` (a :class:`SuffixInput`, text or token ids) after the stable
        prefix, which stays untouched; a previous suffix and generated tokens are replaced.

        The suffix is prefilled under its manifest (default: the session's); one whose
        identity differs from the resident KV's is refused with ``ManifestMismatchError``.
        ``timeout`` / ``on_progress`` as for :meth:`ensure_prefix`; an interrupted prefill
        leaves the suffix tokens already computed resident.
        """
        suffix = as_suffix(suffix)
        with self._call("prefill_suffix", timeout) as watch:
            plan = self._plan_suffix(suffix)
            timings = self._prefill(plan, watch, on_progress)
        return suffix_status(plan, timings)

    def decode(self, config: DecodeConfig | None = None, *, timeout: float | None = None,
               **fields: Unpack[DecodeFields]) -> DecodeStream:
        """The answer from the resident state, as a :class:`DecodeStream` of chunks: validated
        now, submitted at the first iteration (or ``with`` entry).

        Takes a :class:`DecodeConfig` and/or its fields as keywords (``max_tokens=32``).
        Generated tokens stay resident: a second ``decode`` continues after them. Closing the
        stream early cancels the rest. ``timeout``: seconds for the whole stream from its
        submission; past it (or after :meth:`cancel`) the stream ends with a chunk whose
        ``error`` is a ``RequestTimeoutError`` (``RequestCancelledError``), and the session stays
        usable. An engine failure ends the stream with an error chunk and the session turns
        fatal.
        """
        decode = as_decode_config(config, fields)
        request, run = self._decode_request(decode)
        return DecodeStream(self, decode, request, run, timeout)

    def adecode(self, config: DecodeConfig | None = None, *, timeout: float | None = None,
                **fields: Unpack[DecodeFields]) -> AsyncDecodeStream:
        """Async :meth:`decode`: an :class:`AsyncDecodeStream`. No thread per stream: events
        reach the event loop from the engine's thread; closing the stream or cancelling the
        task that reads it cancels the rest."""
        decode = as_decode_config(config, fields)
        request, run = self._decode_request(decode, read_back=False)
        return AsyncDecodeStream(self, decode, request, run, timeout)

    def cancel(self) -> None:
        """Cancel the request this session has in flight (a prefill or a decode stream), from
        any thread or task: the primitive raises ``RequestCancelledError`` (a decode stream ends
        with a ``RequestCancelledError`` chunk) and the session stays usable. A no-op when nothing
        is in flight. (On an inline runtime, call it from the thread that runs the session.)
        """
        watch = self._watch
        if watch is not None:
            watch.cancel()

    def embed(self, text: str | Sequence[str]) -> np.ndarray:
        """Mean-pooled, L2-normalised float32 embeddings of the session's model (with its
        adapters): ``(n_embd,)`` for a string, ``(n, n_embd)`` for a list, computed in batches
        on a private embeddings context (made on first use) that never touches the KV."""
        if self._closed:
            raise SessionClosedError("session is closed")
        if isinstance(text, str):
            row: np.ndarray = self._host.embed([text])[0]
            return row
        return self._host.embed(list(text))

    # --- observability, snapshots -------------------------------------------------------------
    def explain_context(self) -> ContextReport:
        """The resident context and the session's counters (allowed after close/fatal), from
        what the session keeps: no round trip to the engine, so it never blocks a thread or an
        event loop and never changes the session. After a decode stream that ended early, the
        generated tokens are those the stream delivered; the engine may have put a few more in
        the KV, which the session's next primitive reads back (and counts)."""
        stable = hashlib.sha256(",".join(map(str, self._prefix)).encode()).hexdigest()
        n = len(self.resident)
        return ContextReport(
            resident_tokens=n, prefix_tokens=len(self._prefix), suffix_tokens=len(self._suffix),
            generated_tokens=len(self._generated), n_ctx=self.n_ctx,
            available_tokens=self.n_ctx - n, stable_token_hash=stable,
            manifest_digest=self._manifest.identity_digest, manifest=self._manifest,
            closed=self._closed or self._leased.expired.is_set(), fatal=self._fatal is not None,
            num_prefill_calls=self.num_prefill_calls, num_prefill_tokens=self.num_prefill_tokens,
            num_decode_tokens=self.num_decode_tokens)

    def snapshot(self, *, timeout: float | None = None) -> SessionSnapshot:
        """The resident state: KV bytes of the session's sequence plus its tokens."""
        lease = self._lease
        with self._call("snapshot", timeout) as watch:
            return self._snapshot_of(watch.call(lambda engine: engine.leases.save(lease)))

    def restore(self, snapshot: SessionSnapshot, *, timeout: float | None = None) -> None:
        """Replace the resident state with ``snapshot``.

        Compatibility is judged on what the session can verify (model, tokenizer, runtime,
        adapters) and ``n_ctx``: ``ManifestMismatchError``, changing nothing, otherwise. The
        snapshot's declared fields (chat template, BOS policy) become the session's. A failed
        native restore is fatal.
        """
        with self._call("restore", timeout) as watch:
            self._restored(snapshot, watch.call(self._restore_fn(snapshot)))

    def save_snapshot(self, name: str, *, timeout: float | None = None) -> bool:
        """Write :meth:`snapshot` into the server's disk prompt cache under ``name`` (atomic,
        checksummed; counted in its budget and evicted least-recently-used like its other
        entries). False when the server has no disk cache or the snapshot exceeds its budget."""
        data = self.snapshot(timeout=timeout).to_bytes()
        store = self._runtime.call(lambda engine: engine.disk)
        return bool(store.save_blob(name, data))

    def load_snapshot(self, name: str, *, timeout: float | None = None) -> bool:
        """:meth:`restore` the snapshot saved under ``name`` by :meth:`save_snapshot` (on any
        server sharing the folder); False, changing nothing, when there is none (never saved,
        evicted, or corrupt). Raises as :meth:`restore` does for an incompatible snapshot."""
        with self._call("load_snapshot", timeout) as watch:
            data = watch.call(lambda engine: engine.disk).load_blob(name)
            if data is None:
                return False
            snapshot = SessionSnapshot.from_bytes(data)
            self._restored(snapshot, watch.call(self._restore_fn(snapshot)))
        return True

    def next_token_logits(self, *, timeout: float | None = None) -> np.ndarray:
        """Logits for the token after the resident state (a copy), leaving the KV as it was
        (the last resident token is recomputed by the engine)."""
        with self._call("next_token_logits", timeout) as watch:
            return np.array(watch.call(self._logits_fn()), dtype=np.float32, copy=True)

    # --- internals ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _call(self, what: str, timeout: float | None) -> Iterator[CallWatch]:
        """One primitive: the session is checked, its watch is the one :meth:`cancel` sees."""
        watch = CallWatch(self._runtime, timeout, what)
        self._check()
        self._watch = watch
        try:
            yield watch
        finally:
            self._watch = None
            watch.disarm()

    def _check_state(self) -> None:
        if self._closed:
            raise SessionClosedError("session is closed")
        self._leased.check()
        if self._fatal is not None:
            raise SessionFatalError("session is fatal after a failed operation; close and "
                                    "reopen it") from self._fatal
        if self._busy:
            raise SessionBusyError("a decode stream of this session is still open")

    def _check(self) -> None:
        self._check_state()
        if self._stale:
            self._sync_generated()

    def _plan_prefix(self, prefix: PrefixInput) -> PrefillPlan:
        tokens, manifest = tokenize_prefix(self._host, prefix)
        same = manifest.identity_digest == self._manifest.identity_digest
        reusable = common_prefix(self.resident, tokens) if same else 0
        if len(tokens) > self.n_ctx:
            raise ContextOverflowError(stage="ensure_prefix", resident_tokens=reusable,
                                       additional_tokens=len(tokens) - reusable, n_ctx=self.n_ctx)
        return PrefillPlan("ensure_prefix", tokens, len(tokens), manifest, not same,
                           self.resident)

    def _plan_suffix(self, suffix: SuffixInput) -> PrefillPlan:
        if suffix.manifest is not None:
            self._manifest.compare(suffix.manifest)
        n_prefix = len(self._prefix)
        media: tuple[MediaSpan, ...] = ()
        if suffix.media:
            prompt = self._host.media_prompt(suffix.text or "", suffix.media, False)
            tokens = list(prompt)
            media = tuple(MediaSpan(span.start + n_prefix, span.chunk) for span in prompt.media)
        elif suffix.token_ids is not None:
            tokens = list(suffix.token_ids)
        else:
            tokens = self._host.tokenize(suffix.text or "", False)
        if n_prefix + len(tokens) > self.n_ctx:
            raise ContextOverflowError(stage="prefill_suffix", resident_tokens=n_prefix,
                                       additional_tokens=len(tokens), n_ctx=self.n_ctx)
        return PrefillPlan("prefill_suffix", self._prefix + tokens, n_prefix, self._manifest,
                           False, self.resident, media)

    def _snapshot_of(self, state: KvState) -> SessionSnapshot:
        resident, kv = self.resident, list(state.token_ids)
        assert kv == resident[:len(kv)] and len(resident) - len(kv) <= 1, "KV out of sync"
        return SessionSnapshot(state=state.state, token_ids=tuple(resident),
                               kv_tokens=len(kv), prefix_tokens=len(self._prefix),
                               suffix_tokens=len(self._suffix), n_ctx=self.n_ctx,
                               manifest=self._manifest)

    def _restore_fn(self, snapshot: SessionSnapshot) -> Callable[[Engine], bool]:
        """The engine call restoring ``snapshot`` (validated first, changing nothing)."""
        self._host.base_manifest.check_verified(snapshot.manifest)
        if snapshot.n_ctx != self.n_ctx:
            raise ManifestMismatchError("n_ctx", self.n_ctx, snapshot.n_ctx)
        lease, identity = self._lease, snapshot.manifest.identity_digest
        state = KvState(snapshot.state, tuple(snapshot.token_ids[:snapshot.kv_tokens]))
        return lambda engine: engine.leases.restore(lease, state, cache_identity=identity)

    def _restored(self, snapshot: SessionSnapshot, ok: bool) -> None:
        if not ok:
            self._prefix, self._suffix, self._generated = [], [], []
            self._fatal = LlamapyError("state_seq_set failed")
            raise SessionFatalError("restoring the snapshot failed; the session is fatal")
        tokens, p, s = list(snapshot.token_ids), snapshot.prefix_tokens, snapshot.suffix_tokens
        self._prefix, self._suffix, self._generated = tokens[:p], tokens[p:p + s], tokens[p + s:]
        self._manifest = snapshot.manifest

    def _logits_fn(self) -> Callable[[Engine], Sequence[float]]:
        resident, lease = self.resident, self._lease
        if not resident:
            raise InvalidOptionError("no resident tokens", option="prefix")
        return lambda engine: engine.leases.next_token_logits(lease, resident)

    def _request(self, tokens: list[int], max_tokens: int, identity: str,
                 sampling: Any = None, speculative: Any = None,
                 progress: bool = False, request_id: Hashable | None = None,
                 media: tuple[MediaSpan, ...] = (), checkpoint_hints: tuple[int, ...] = ()
                 ) -> Request:
        options = RequestOptions(max_tokens=max_tokens, cache_scope=self.config.cache_scope,
                                 adapters=self._host.adapter_set, speculative=speculative,
                                 return_progress=progress,
                                 **({} if sampling is None else {"sampling": sampling}))
        return Request(request_id=new_request_id() if request_id is None else request_id,
                       token_ids=tokens, options=options, cache_identity=identity,
                       lease_id=self._lease, media=media, checkpoint_hints=checkpoint_hints)


def prefix_status(plan: PrefillPlan, timings: RequestTimings) -> PrefixStatus:
    """What an ``ensure_prefix`` reused versus computed."""
    reused = timings.reused_tokens
    return PrefixStatus(prefix_tokens=len(plan.tokens), reused_tokens=reused,
                        prefilled_tokens=timings.prefill_tokens,
                        dropped_tokens=len(plan.old) - min(reused, len(plan.old)),
                        cold=reused == 0, identity_changed=plan.wipe, timings=timings)


def suffix_status(plan: PrefillPlan, timings: RequestTimings) -> SuffixStatus:
    """What a ``prefill_suffix`` reused versus computed (suffix tokens only)."""
    n_prefix = plan.n_fixed
    reused = max(0, timings.reused_tokens - n_prefix)
    return SuffixStatus(suffix_tokens=len(plan.tokens) - n_prefix, reused_tokens=reused,
                        prefilled_tokens=timings.prefill_tokens,
                        dropped_tokens=len(plan.old) - n_prefix - reused, timings=timings)
