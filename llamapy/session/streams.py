"""The decode streams of a :class:`~llamapy.session.Session` (sync and asyncio), and what an
early end means for the resident tokens.

A stream submits one request on the session's lease through the runtime's event client and
turns its events into :class:`~llamapy.session.config.StreamChunk` s. A stream closed early (or
whose task was cancelled) cancels its request; the tokens that reached the KV meanwhile are read
back from the lease before the session's next primitive (``_sync_generated``). An engine error
ends the stream with an error chunk and makes the session fatal, unless the request was refused
before it generated anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from typing import TYPE_CHECKING, Any

from llamapy.engine.request import DoneEvent, ErrorEvent, Event, ProgressEvent, Request, TokenEvent
from llamapy.errors import (
    ContextOverflowError,
    GrammarError,
    InvalidOptionError,
    LlamapyError,
    QueueFullError,
    SessionFatalError,
)
from llamapy.runtime import AsyncRequestStream, RequestStream
from llamapy.session.config import DecodeConfig, SessionConfig, StreamChunk
from llamapy.session.decoding import DecodeRun

if TYPE_CHECKING:
    from llamapy.runtime import Runtime
    from llamapy.session.host import SessionHost
    from llamapy.session.manifest import ContextManifest

__all__ = ["DecodeStreams"]

#: Errors an engine raises at submission, changing nothing (the session stays usable).
_DECODE_SUBMIT_ERRORS = (InvalidOptionError, ContextOverflowError, QueueFullError, GrammarError)
#: Resident tokens rendered to see whether the prompt opened a reasoning block.
_TAIL_TOKENS = 16


class DecodeStreams:
    """The decoding half of :class:`~llamapy.session.Session` (state lives on the session)."""

    config: SessionConfig
    _host: SessionHost
    _runtime: Runtime
    _lease: int
    _manifest: ContextManifest
    _prefix: list[int]
    _suffix: list[int]
    _generated: list[int]
    _fatal: BaseException | None
    _busy: bool
    _stale: bool
    num_decode_tokens: int

    if TYPE_CHECKING:  # defined by the session
        @property
        def resident(self) -> list[int]: ...

        @property
        def n_ctx(self) -> int: ...

        def _check(self) -> None: ...

        def _request(self, tokens: list[int], max_tokens: int, identity: str,
                     sampling: Any = None, speculative: Any = None) -> Request: ...

    def _decode_request(self, config: DecodeConfig) -> tuple[Request, DecodeRun]:
        self._check()
        resident = self.resident
        if not resident:
            raise InvalidOptionError("decode needs a resident prefix or suffix", option="prefix")
        room = self.n_ctx - len(resident)
        max_tokens = config.max_tokens if config.max_tokens is not None else room
        if max_tokens > room or room <= 0:
            raise ContextOverflowError(stage="decode", resident_tokens=len(resident),
                                       additional_tokens=max(1, max_tokens), n_ctx=self.n_ctx)
        tail = ""
        if config.parser_protocols and config.reasoning_format != "none":
            tail = self._host.detokenize(resident[-_TAIL_TOKENS:])
        run = DecodeRun(config, self._host.sampling, tail)
        request = self._request(resident, max_tokens, self._manifest.identity_digest,
                                run.sampling, config.speculative)
        return request, run

    def _stream(self, request: Request, run: DecodeRun) -> Generator[StreamChunk, None, None]:
        self._check()
        self._busy = True
        stream = None
        try:
            stream = RequestStream(self._runtime, request, self.config.request_timeout)
            for event in stream:
                chunk = self._on_event(event, run)
                if chunk is not None:
                    yield chunk
        except LlamapyError as exc:
            yield self._failed(exc, stream)
        finally:
            self._ended(stream)

    async def _astream(self, request: Request, run: DecodeRun) -> AsyncIterator[StreamChunk]:
        self._check()
        self._busy = True
        stream = None
        try:
            stream = AsyncRequestStream(self._runtime, request, self.config.request_timeout)
            async for event in stream:
                chunk = self._on_event(event, run)
                if chunk is not None:
                    yield chunk
        except LlamapyError as exc:
            yield self._failed(exc, stream)
        finally:
            self._ended(stream)

    def _on_event(self, event: Event, run: DecodeRun) -> StreamChunk | None:
        if isinstance(event, TokenEvent):
            self._generated.append(event.token_id)
            self.num_decode_tokens += 1
            return run.feed(event.text)
        if isinstance(event, ProgressEvent):
            return None
        assert isinstance(event, DoneEvent)
        return run.finish(str(event.finish_reason))

    def _failed(self, exc: LlamapyError, stream: RequestStream | AsyncRequestStream | None
                ) -> StreamChunk:
        """The error chunk; the session turns fatal unless the request was refused before
        it generated anything (bad grammar, no room, queue full)."""
        final = None if stream is None else stream.final
        harmless = isinstance(exc, _DECODE_SUBMIT_ERRORS) and (
            stream is None or (isinstance(final, ErrorEvent) and final.completion_tokens == 0))
        if not harmless:
            self._fatal = exc
        return StreamChunk(error=exc, finish_reason="error")

    def _ended(self, stream: RequestStream | AsyncRequestStream | None) -> None:
        """After a decode stream: one closed early (or whose task was cancelled) cancels its
        request; the tokens that reached the KV meanwhile are read back before the next
        primitive (:meth:`_sync_generated`)."""
        self._busy = False
        if stream is not None and not stream.done:
            stream.cancel()
            self._stale = self._fatal is None

    def _sync_generated(self) -> None:
        """After a cancelled decode: the generated tokens are those in the lease's KV (the
        engine may have produced more than were read), or the tokens read when they are one
        sampled token ahead of the KV (that token's KV is computed by the next request)."""
        self._stale = False
        lease, fixed, seen = self._lease, self._prefix + self._suffix, self._generated
        kv = self._runtime.call(lambda engine: engine.leases.tokens(lease))
        if kv[:len(fixed)] != fixed:
            self._fatal = LlamapyError("the lease's KV no longer holds the session's prefix")
            raise SessionFatalError("session KV out of sync; close and reopen it")
        in_kv = kv[len(fixed):]
        if len(seen) == len(in_kv) + 1 and seen[:len(in_kv)] == in_kv:
            return
        self.num_decode_tokens += max(0, len(in_kv) - len(seen))
        self._generated = in_kv
