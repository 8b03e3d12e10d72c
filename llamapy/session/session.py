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
import itertools
from collections.abc import AsyncIterator, Generator, Sequence

import numpy as np

from llamapy.engine.engine import Engine
from llamapy.engine.options import RequestOptions
from llamapy.engine.ram_cache import common_prefix
from llamapy.engine.request import DoneEvent, ErrorEvent, Request, RequestTimings, TokenEvent
from llamapy.errors import (
    ContextOverflowError,
    GrammarError,
    InvalidOptionError,
    LlamapyError,
    ManifestMismatchError,
    QueueFullError,
    SessionBusyError,
    SessionClosedError,
    SessionFatalError,
)
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
from llamapy.session.decoding import DecodeRun, async_stream, next_token_logits
from llamapy.session.host import EventQueue, SessionHost
from llamapy.session.manifest import ContextManifest, declared_identity, segments_for
from llamapy.session.snapshot import SessionSnapshot

__all__ = ["Session"]

_ids = itertools.count(1)
#: Errors an engine raises at submission, changing nothing (the session stays usable).
_SUBMIT_ERRORS = (InvalidOptionError, ContextOverflowError, QueueFullError)
_DECODE_SUBMIT_ERRORS = (*_SUBMIT_ERRORS, GrammarError)
#: Resident tokens rendered to see whether the prompt opened a reasoning block.
_TAIL_TOKENS = 16


class Session:
    """A persistent workspace session holding one leased slot. Use as a context manager.

    Not for concurrent use from several threads; a primitive called while a decode stream is
    open raises :class:`SessionBusyError`.
    """

    def __init__(self, host: SessionHost, config: SessionConfig | None = None) -> None:
        self.config = config or SessionConfig()
        self._host = host
        self._manifest = host.base_manifest
        self._lease = host.lease(self.config.cache_scope, self._manifest.identity_digest,
                                 self.config.lease_timeout)
        self._prefix: list[int] = []
        self._suffix: list[int] = []
        self._generated: list[int] = []
        self._closed = False
        self._fatal: BaseException | None = None
        self._busy = False
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
            self._host.release(self._lease)
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
    def ensure_prefix(self, prefix: PrefixInput) -> PrefixStatus:
        """Make the resident state equal ``prefix``: reuse the longest matching resident token
        prefix (same identity only), drop the rest (suffix and generated tokens included),
        prefill the divergent tail."""
        self._check()
        tokens, manifest = self._tokenize_prefix(prefix)
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

    def prefill_suffix(self, suffix: SuffixInput) -> SuffixStatus:
        """Prefill ``suffix`` after the stable prefix (which stays untouched); a previous suffix
        and generated tokens are replaced."""
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
        assert timings.reused_tokens >= n_prefix or not n_prefix or timings.reused_tokens == \
            len(self._prefix + tokens), "prefill_suffix recomputed the prefix"
        self._suffix, self._generated = tokens, []
        reused = max(0, timings.reused_tokens - n_prefix)
        return SuffixStatus(suffix_tokens=len(tokens), reused_tokens=reused,
                            prefilled_tokens=timings.prefill_tokens,
                            dropped_tokens=len(old) - n_prefix - reused, timings=timings)

    def decode(self, config: DecodeConfig | None = None) -> Generator[StreamChunk, None, None]:
        """Stream the answer from the resident state (validated now, run while iterated).

        Generated tokens stay resident: a second ``decode`` continues after them. Closing the
        iterator early cancels the rest. An engine failure ends the stream with a chunk whose
        ``error`` is set, and the session turns fatal.
        """
        self._check()
        config = config or DecodeConfig()
        resident = self.resident
        if not resident:
            raise InvalidOptionError("decode needs a resident prefix or suffix", option="prefix")
        room = self.n_ctx - len(resident)
        max_tokens = config.max_tokens if config.max_tokens is not None else room
        if max_tokens > room or room <= 0:
            raise ContextOverflowError(stage="decode", resident_tokens=len(resident),
                                       additional_tokens=max(1, max_tokens), n_ctx=self.n_ctx)
        run = DecodeRun(config, self._host.sampling, self._prompt_tail(config, resident))
        options = RequestOptions(max_tokens=max_tokens, cache_scope=self.config.cache_scope,
                                 sampling=run.sampling)
        return self._stream(resident, options, run)

    def adecode(self, config: DecodeConfig | None = None) -> AsyncIterator[StreamChunk]:
        """Async :meth:`decode` (validated now). The stream runs on its own worker thread, so
        waiting never blocks the event loop; closing or cancelling early cancels the rest
        after the step in flight (the thread serialises them)."""
        return async_stream(self.decode(config))

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

        def grab(engine: Engine) -> tuple[bytes, list[int]]:
            seq = engine.lease_seq_id(lease)
            return engine.backend.state_seq_get(seq), engine.slot_tokens(lease)

        state, kv = self._host.call(grab)
        resident = self.resident
        assert kv == resident[:len(kv)] and len(resident) - len(kv) <= 1, "KV out of sync"
        return SessionSnapshot(state=state, token_ids=tuple(resident), kv_tokens=len(kv),
                               prefix_tokens=len(self._prefix), suffix_tokens=len(self._suffix),
                               n_ctx=self.n_ctx, manifest=self._manifest)

    def restore(self, snapshot: SessionSnapshot) -> None:
        """Replace the resident state with ``snapshot``; ``ManifestMismatchError`` (changing
        nothing) when its identity or ``n_ctx`` differs. A failed native restore is fatal."""
        self._check()
        self._manifest.compare(snapshot.manifest)
        if snapshot.n_ctx != self.n_ctx:
            raise ManifestMismatchError("n_ctx", self.n_ctx, snapshot.n_ctx)
        lease, kv = self._lease, list(snapshot.token_ids[:snapshot.kv_tokens])
        identity = snapshot.manifest.identity_digest

        def put(engine: Engine) -> bool:
            seq = engine.lease_seq_id(lease)
            ok = engine.backend.state_seq_set(seq, snapshot.state)
            if not ok or engine.backend.seq_pos_max(seq) != len(kv) - 1:
                engine.backend.seq_rm(seq, 0, -1)
                engine.set_slot_tokens(lease, [], cache_identity=identity)
                return False
            engine.set_slot_tokens(lease, kv, cache_identity=identity)
            return True

        if not self._host.call(put):
            self._prefix, self._suffix, self._generated = [], [], []
            self._fatal = LlamapyError("state_seq_set failed")
            raise SessionFatalError("restoring the snapshot failed; the session is fatal")
        tokens, p, s = list(snapshot.token_ids), snapshot.prefix_tokens, snapshot.suffix_tokens
        self._prefix, self._suffix, self._generated = tokens[:p], tokens[p:p + s], tokens[p + s:]
        self._manifest = snapshot.manifest

    def next_token_logits(self) -> np.ndarray:
        """Logits for the token after the resident state (a copy), leaving the KV as it was.

        Recomputes the last resident token on the native backend (needs ``Context.logits``).
        """
        self._check()
        resident, lease = self.resident, self._lease

        if not resident:
            raise InvalidOptionError("no resident tokens", option="prefix")
        return self._host.call(lambda engine: next_token_logits(engine, lease, resident))

    # --- internals ----------------------------------------------------------------------------
    def _tokenize_prefix(self, prefix: PrefixInput) -> tuple[list[int], ContextManifest]:
        add_bos = self._host.add_bos if prefix.add_bos is None else prefix.add_bos
        if prefix.token_ids is not None:
            parts = [("tokens", "", list(prefix.token_ids))]
        else:
            pieces = [(s.kind, s.text) for s in prefix.segments] or [("text", prefix.text or "")]
            parts = [(kind, text, self._host.tokenize(text, add_bos and i == 0))
                     for i, (kind, text) in enumerate(pieces)]
        bos_policy = None if prefix.add_bos is None else ("bos" if add_bos else "no_bos")
        manifest = declared_identity(self._host.base_manifest, prefix.manifest, bos_policy)
        return [t for *_, ids in parts for t in ids], manifest.replace(
            segments=segments_for(parts))

    def _prompt_tail(self, config: DecodeConfig, resident: list[int]) -> str:
        """The text the resident tokens end with, when a reasoning parser needs it."""
        if not config.parser_protocols or config.reasoning_format == "none":
            return ""
        return self._host.detokenize(resident[-_TAIL_TOKENS:])

    def _wipe(self, identity: str) -> None:
        """Drop the resident KV and re-file the slot under ``identity`` (a new manifest
        identity must never reuse KV, whatever the engine's reuse paths would do)."""
        lease = self._lease

        def wipe(engine: Engine) -> None:
            engine.backend.seq_rm(engine.lease_seq_id(lease), 0, -1)
            engine.set_slot_tokens(lease, [], cache_identity=identity)

        self._host.call(wipe)
        self._prefix, self._suffix, self._generated = [], [], []

    def _prefill(self, tokens: list[int], manifest: ContextManifest) -> RequestTimings:
        options = RequestOptions(max_tokens=0, cache_scope=self.config.cache_scope)
        events = EventQueue()
        request = Request(request_id=("session", next(_ids)), token_ids=tokens, options=options,
                          sink=events.sink, cache_identity=manifest.identity_digest,
                          lease_id=self._lease)
        self.num_prefill_calls += 1
        try:
            self._host.submit(request)
            event = self._host.wait(events, self.config.request_timeout)
        except _SUBMIT_ERRORS:
            raise
        except LlamapyError as exc:  # a failed or stalled prefill: the KV state is unknown
            self._host.cancel(request.request_id)
            self._fatal = exc
            raise SessionFatalError(f"prefill failed: {exc}") from exc
        if isinstance(event, ErrorEvent):
            if isinstance(event.exc, _SUBMIT_ERRORS) and event.timings.prefill_tokens == 0:
                raise event.exc
            self._fatal = event.exc
            raise SessionFatalError(f"prefill failed: {event.exc}") from event.exc
        assert isinstance(event, DoneEvent), f"prefill: unexpected event {event!r}"
        self.num_prefill_tokens += event.timings.prefill_tokens
        return event.timings

    def _stream(self, resident: list[int], options: RequestOptions,
                run: DecodeRun) -> Generator[StreamChunk, None, None]:
        self._check()
        self._busy = True
        events = EventQueue()
        request = Request(request_id=("session", next(_ids)), token_ids=resident,
                          options=options, sink=events.sink,
                          cache_identity=self._manifest.identity_digest, lease_id=self._lease)
        done = False
        try:
            self._host.submit(request)
            while not done:
                event = self._host.wait(events, self.config.request_timeout)
                done = not isinstance(event, TokenEvent)
                chunk = self._on_event(event, run)
                if chunk is not None:
                    yield chunk
        except _DECODE_SUBMIT_ERRORS as exc:
            done = True
            yield StreamChunk(error=exc, finish_reason="error")
        except LlamapyError as exc:
            self._fatal = exc
            yield StreamChunk(error=exc, finish_reason="error")
        finally:
            if not done and self._fatal is None:
                self._drain_cancelled(request, events)
            self._busy = False

    def _on_event(self, event: object, run: DecodeRun) -> StreamChunk | None:
        if isinstance(event, TokenEvent):
            self._generated.append(event.token_id)
            self.num_decode_tokens += 1
            return run.feed(event.text)
        if isinstance(event, ErrorEvent):
            harmless = isinstance(event.exc, _DECODE_SUBMIT_ERRORS)
            if not (harmless and event.completion_tokens == 0):
                self._fatal = event.exc
            return StreamChunk(error=event.exc, finish_reason="error")
        assert isinstance(event, DoneEvent)
        return run.finish(str(event.finish_reason))

    def _drain_cancelled(self, request: Request, events: EventQueue) -> None:
        """After an early close: cancel, then account every token the engine still sent."""
        self._host.cancel(request.request_id)
        try:
            while True:
                event = self._host.wait(events, self.config.request_timeout)
                if isinstance(event, TokenEvent):
                    self._generated.append(event.token_id)
                    self.num_decode_tokens += 1
                else:
                    return
        except LlamapyError as exc:
            self._fatal = exc
