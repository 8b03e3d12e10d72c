"""The prefills of a session (``ensure_prefix``, ``prefill_suffix``), blocking and async, and
what an interrupted one leaves behind.

A prefill is one engine request on the session's lease (``max_tokens=0``) that asks for
progress events (one before its first prompt chunk, one after each chunk), so that
``SessionConfig.request_timeout`` bounds a *stall* (seconds without any event), never the
length of a prefill that keeps progressing; ``timeout=`` bounds the whole call
(:mod:`llamapy.session.watch`); ``on_progress`` sees each :class:`PrefillProgress`.

An interrupted prefill is not fatal. Whatever ended it (its deadline, a stall,
``Session.cancel()``, the cancelled task awaiting it, an exception from ``on_progress``, or an
engine error, after which the engine has resynced the slot's KV to what it knows), the session
reads back the tokens whose KV its lease holds (exact, by the slot invariant) and adopts them:

- a prefix of what was asked: the kept tokens up to the stable prefix's length are the prefix
  (for ``ensure_prefix`` under the new manifest, its segments clipped to the whole segments
  kept), the rest is the suffix, nothing is generated. A retry reuses them (token LCP);
- the resident tokens as they were (the request never ran): nothing changes.

Then the typed error is raised (``RequestTimeoutError``, ``RequestCancelledError``, the
engine's, the callback's; a cancelled task's ``asyncio.CancelledError`` propagates). Only a
KV that cannot be read back, or that is neither, makes the session fatal
(``SessionFatalError``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llamapy.engine.media import MediaSpan
from llamapy.engine.request import DoneEvent, ProgressEvent, Request, RequestTimings
from llamapy.errors import SessionFatalError
from llamapy.runtime import AsyncRequestStream, RequestStream

if TYPE_CHECKING:
    import asyncio

    from llamapy.engine.engine import Engine
    from llamapy.runtime import Runtime
    from llamapy.session.config import SessionConfig
    from llamapy.session.manifest import ContextManifest
    from llamapy.session.watch import CallWatch

__all__ = ["PrefillPlan", "PrefillProgress", "Prefills", "ProgressCallback"]

#: Seconds a rollback waits to read the lease's KV back (served between two ticks).
READ_BACK_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class PrefillProgress:
    """Progress of one prefill: ``total_tokens`` the request holds (for ``prefill_suffix``
    the stable prefix included), ``reused_tokens`` of them already resident, and
    ``processed_tokens`` (reused included) computed so far. The last report of a prefill
    that succeeds has ``processed_tokens == total_tokens``."""

    total_tokens: int
    reused_tokens: int
    processed_tokens: int

    @property
    def fraction(self) -> float:
        """``processed_tokens / total_tokens`` (1.0 for an empty request)."""
        return self.processed_tokens / self.total_tokens if self.total_tokens else 1.0


#: Called with each :class:`PrefillProgress` (in the caller's thread, or on the event loop).
ProgressCallback = Callable[[PrefillProgress], None]


@dataclass(slots=True)
class PrefillPlan:
    """One prefill, validated: the target ``tokens`` (the first ``n_fixed`` are the stable
    prefix), their ``manifest``, whether the KV is dropped first (``wipe``: the identity
    changed) and the resident state before (``old``)."""

    stage: str
    tokens: list[int]
    n_fixed: int
    manifest: ContextManifest
    wipe: bool
    old: list[int]
    #: The suffix's images and audio, placed in ``tokens`` (see ``SuffixInput.media``).
    media: tuple[MediaSpan, ...] = ()


class _Reporter:
    """Turns progress events into :class:`PrefillProgress` calls."""

    __slots__ = ("callback", "last")

    def __init__(self, callback: ProgressCallback | None) -> None:
        self.callback = callback
        self.last: PrefillProgress | None = None

    def feed(self, event: ProgressEvent) -> None:
        if self.callback is not None:
            self.last = PrefillProgress(event.total, event.cache, event.processed)
            self.callback(self.last)

    def finish(self, total: int, timings: RequestTimings) -> None:
        """Report completion when the engine's last event did not (a prompt all reused)."""
        if self.callback is not None and (self.last is None or
                                          self.last.processed_tokens < total):
            self.callback(PrefillProgress(total, timings.reused_tokens, total))


def clip_segments(manifest: ContextManifest, n_tokens: int) -> ContextManifest:
    """``manifest`` with only the segments wholly within the first ``n_tokens``."""
    kept = tuple(s for s in manifest.segments if s.token_end <= n_tokens)
    return manifest if len(kept) == len(manifest.segments) else manifest.replace(segments=kept)


class Prefills:
    """The prefill half of :class:`~llamapy.session.Session` (state lives on the session)."""

    config: SessionConfig
    _runtime: Runtime
    _lease: int
    _manifest: ContextManifest
    _prefix: list[int]
    _suffix: list[int]
    _generated: list[int]
    _fatal: BaseException | None
    num_prefill_calls: int
    num_prefill_tokens: int

    if TYPE_CHECKING:  # defined by the session
        def _request(self, tokens: list[int], max_tokens: int, identity: str,
                     sampling: Any = None, speculative: Any = None,
                     progress: bool = False, request_id: Hashable | None = None,
                     media: tuple[MediaSpan, ...] = (),
                 checkpoint_hints: tuple[int, ...] = ()) -> Request: ...

    def _prefill(self, plan: PrefillPlan, watch: CallWatch,
                 on_progress: ProgressCallback | None) -> RequestTimings:
        """Run ``plan`` on the lease, blocking (see the module docstring)."""
        request = self._prefill_request(plan)
        reporter, stream = _Reporter(on_progress), None
        try:
            if plan.wipe:
                watch.call(self._wipe_fn(plan))
            watch.arm(request.request_id)
            stream = RequestStream(self._runtime, request, self.config.request_timeout)
            watch.recheck()
            for event in stream:
                watch.poll()
                if isinstance(event, ProgressEvent):
                    reporter.feed(event)
            return self._prefilled(plan, stream, reporter)
        except BaseException as exc:
            if stream is not None:
                stream.cancel()
            error = self._settle(plan, exc, watch, stream, self._read_kv())
            if error is exc:
                raise
            raise error from exc
        finally:
            watch.disarm()

    async def _aprefill(self, plan: PrefillPlan, watch: CallWatch,
                        on_progress: ProgressCallback | None,
                        loop: asyncio.AbstractEventLoop) -> RequestTimings:
        """Run ``plan`` on the lease from a coroutine (no thread blocked)."""
        request = self._prefill_request(plan)
        reporter, stream = _Reporter(on_progress), None
        try:
            if plan.wipe:
                await watch.acall(self._wipe_fn(plan))
            watch.arm(request.request_id, loop)
            stream = AsyncRequestStream(self._runtime, request, self.config.request_timeout)
            watch.recheck()
            async for event in stream:
                watch.poll()
                if isinstance(event, ProgressEvent):
                    reporter.feed(event)
            return self._prefilled(plan, stream, reporter)
        except BaseException as exc:
            if stream is not None:
                stream.cancel()
            error = self._settle(plan, exc, watch, stream, await self._aread_kv())
            if error is exc:
                raise
            raise error from exc
        finally:
            watch.disarm()

    def _prefill_request(self, plan: PrefillPlan) -> Request:
        """The engine request of ``plan``. A model whose state cannot be cut back keeps a
        restore point where the stable prefix ends and where each of its segments ends (the
        next suffix, or a changed later segment, starts there)."""
        self.num_prefill_calls += 1
        hints = (plan.n_fixed, *(s.token_end for s in plan.manifest.segments))
        return self._request(plan.tokens, 0, plan.manifest.identity_digest, progress=True,
                             media=plan.media, checkpoint_hints=hints)

    def _wipe_fn(self, plan: PrefillPlan) -> Callable[[Engine], int]:
        """Drop the resident KV and re-file the slot under the new identity (a new manifest
        identity must never reuse KV, whatever the engine's reuse paths would do)."""
        lease, identity = self._lease, plan.manifest.identity_digest
        self._prefix, self._suffix, self._generated = [], [], []
        self._manifest = clip_segments(plan.manifest, 0)
        return lambda engine: engine.leases.clear(lease, identity)

    def _prefilled(self, plan: PrefillPlan, stream: RequestStream | AsyncRequestStream,
                   reporter: _Reporter) -> RequestTimings:
        final = stream.final
        assert isinstance(final, DoneEvent), "prefill ended without a final event"
        reporter.finish(len(plan.tokens), final.timings)
        self.num_prefill_tokens += final.timings.prefill_tokens
        n = plan.n_fixed
        self._prefix, self._suffix, self._generated = plan.tokens[:n], plan.tokens[n:], []
        self._manifest = plan.manifest
        return final.timings

    def _read_kv(self) -> list[int] | None:
        """The tokens whose KV the lease holds (None when they cannot be read)."""
        lease = self._lease
        try:
            return self._runtime.call(lambda engine: engine.leases.tokens(lease),
                                      READ_BACK_TIMEOUT)
        except Exception:
            return None

    async def _aread_kv(self) -> list[int] | None:
        lease = self._lease
        try:
            return await self._runtime.acall(lambda engine: engine.leases.tokens(lease),
                                             READ_BACK_TIMEOUT)
        except BaseException:  # (cancelled again while rolling back: the KV is unknown)
            return None

    def _settle(self, plan: PrefillPlan, exc: BaseException, watch: CallWatch,
                stream: RequestStream | AsyncRequestStream | None,
                kv: list[int] | None) -> BaseException:
        """Adopt the KV after an interrupted prefill; the error to raise."""
        final = None if stream is None else stream.final
        if final is not None:
            self.num_prefill_tokens += final.timings.prefill_tokens
        error = watch.error(exc)
        if kv is not None and self._adopt(plan, kv):
            return error
        self._fatal = error
        if not isinstance(exc, Exception):  # a cancelled task, KeyboardInterrupt: propagate
            return exc
        return SessionFatalError(f"{plan.stage} was interrupted ({error!r}) and the session's "
                                 "KV could not be read back; close and reopen the session")

    def _adopt(self, plan: PrefillPlan, kv: list[int]) -> bool:
        """Make the resident state ``kv``, when it is consistent with ``plan``."""
        if kv == plan.tokens[:len(kv)]:
            n = min(len(kv), plan.n_fixed)
            self._prefix, self._suffix, self._generated = kv[:n], kv[n:], []
            self._manifest = clip_segments(plan.manifest, n)
            return True
        unchanged = not plan.wipe and kv == plan.old[:len(kv)] and len(plan.old) - len(kv) <= 1
        return unchanged
