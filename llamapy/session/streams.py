"""The decode streams of a :class:`~llamapy.session.Session`: :class:`DecodeStream` (blocking)
and :class:`AsyncDecodeStream` (asyncio), and what an early end means for the resident tokens.

The submission rule (the same for every stream of the package): a stream is validated when it
is made, and its request is submitted at the first iteration (or on ``with`` / ``async with``
entry); a stream cancelled or closed before that is never submitted. So a stream that is made
and dropped costs nothing, and ``request_id`` is known before anything runs. It decodes from
the resident state at its submission: a prefill made between the call and the first iteration
is decoded after (the request is rebuilt and checked again).

A stream turns its request's events into :class:`~llamapy.session.config.StreamChunk` s. A
stream closed early (or whose task was cancelled) cancels its request; ``cancel()`` (any
thread) stops it at the engine, and the stream ends with a chunk whose ``error`` is a
``RequestCancelledError``; past its deadline (``timeout=``, counted from submission) it ends with a
``RequestTimeoutError`` chunk. None of these is fatal: the tokens that reached the KV meanwhile
are read back before the session's next primitive (``_sync_generated``). An engine error ends
the stream with an error chunk and makes the session fatal, unless the request was refused
before it generated anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable, Iterator
from typing import TYPE_CHECKING, Any

from llamapy.engine.media import MediaSpan
from llamapy.engine.request import DoneEvent, ErrorEvent, Event, FinishReason, Request, TokenEvent
from llamapy.errors import (
    ContextOverflowError,
    GrammarError,
    InvalidOptionError,
    LlamapyError,
    QueueFullError,
    RequestCancelledError,
    RequestTimeoutError,
)
from llamapy.runtime import AsyncRequestStream, RequestStream
from llamapy.session.config import DecodeConfig, SessionConfig, StreamChunk
from llamapy.session.decoding import DecodeRun
from llamapy.session.watch import CallWatch

if TYPE_CHECKING:
    from llamapy.runtime import Runtime
    from llamapy.session.host import SessionHost
    from llamapy.session.manifest import ContextManifest

__all__ = ["AsyncDecodeStream", "DecodeStream", "DecodeStreams"]

#: Errors an engine raises at submission, changing nothing (the session stays usable).
_DECODE_SUBMIT_ERRORS = (InvalidOptionError, ContextOverflowError, QueueFullError, GrammarError)
#: Resident tokens rendered to see whether the prompt opened a reasoning block.
_TAIL_TOKENS = 16


class _Stream:
    """What the blocking and async decode streams share."""

    def __init__(self, session: DecodeStreams, config: DecodeConfig, request: Request,
                 run: DecodeRun, timeout: float | None) -> None:
        CallWatch(session._runtime, timeout, "decode")  # validate the timeout now
        self.request_id: Hashable = request.request_id
        self._session = session
        self._config = config
        self._request = request
        self._run = run
        self._timeout = timeout
        self._watch: CallWatch | None = None
        self._events: RequestStream | AsyncRequestStream | None = None
        self._pending: list[StreamChunk] = []
        self._cancelled = False
        self._open = False
        self._owner = False
        self._ended = False

    def cancel(self) -> None:
        """Stop the request (safe from any thread): the stream ends with a chunk whose
        ``error`` is a ``RequestCancelledError``. Before submission: it is never submitted."""
        self._cancelled = True
        watch = self._watch
        if watch is not None:
            watch.cancel()

    def _begin(self, loop: asyncio.AbstractEventLoop | None = None) -> CallWatch | None:
        """Open the stream: the session turns busy; None when cancelled before submission."""
        session = self._session
        session._check()
        self._refresh()
        self._open = True
        if self._cancelled:
            self._ended = True
            self._pending.append(StreamChunk(error=RequestCancelledError("decode was cancelled "
                                                                  "before it was submitted"),
                                             finish_reason="cancelled"))
            return None
        watch = CallWatch(session._runtime, self._timeout, "decode")
        watch.arm(self.request_id, loop)
        self._watch = session._watch = watch
        session._busy = self._owner = True
        return watch

    def _refresh(self) -> None:
        """Rebuild (and re-validate) the request when the resident state moved since the call
        (a prefill, another decode or a read-back in between): a stream decodes from the state
        at its submission."""
        session, request = self._session, self._request
        if (list(request.token_ids) != session.resident
                or request.cache_identity != session._manifest.identity_digest):
            self._request, self._run = session._decode_request(self._config, self.request_id)

    def _submitted(self, events: RequestStream | AsyncRequestStream) -> None:
        self._events = events
        assert self._watch is not None
        if self._cancelled:  # (a cancel that raced the submission)
            self._watch.cancel()
        self._watch.recheck()

    def _chunk(self, event: Event) -> StreamChunk | None:
        assert self._watch is not None
        self._watch.poll()
        chunk = self._session._on_event(event, self._run)
        if isinstance(event, DoneEvent):
            self._end()
        return chunk

    def _fail(self, exc: LlamapyError) -> StreamChunk:
        assert self._watch is not None
        error = self._watch.error(exc)
        chunk = self._session._failed(error if isinstance(error, LlamapyError) else exc,
                                      self._events)
        self._end()
        return chunk

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._watch is not None:
            self._watch.disarm()
        if self._owner:
            self._session._ended(self._events)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to cancel
            self._end()


class DecodeStream(_Stream, Iterator[StreamChunk]):
    """The chunks of one blocking decode (see the module docstring); a context manager."""

    def __iter__(self) -> DecodeStream:
        return self

    def _start(self) -> None:
        if self._open or self._ended:
            return
        if self._begin() is None:
            return
        try:
            self._submitted(RequestStream(self._session._runtime, self._request,
                                          self._session.config.request_timeout))
        except LlamapyError as exc:
            self._pending.append(self._fail(exc))

    def __next__(self) -> StreamChunk:
        self._start()
        if self._pending:
            return self._pending.pop(0)
        events = self._events
        if self._ended or not isinstance(events, RequestStream):
            raise StopIteration
        try:
            for event in events:
                chunk = self._chunk(event)
                if chunk is not None:
                    return chunk
        except LlamapyError as exc:
            return self._fail(exc)
        except BaseException:
            self._end()
            raise
        self._end()
        raise StopIteration

    def close(self) -> None:
        """Stop reading: the request is cancelled if it still runs (never submitted if it had
        not started); the tokens it generated stay resident."""
        self._ended = self._ended or not self._open
        self._end()

    def __enter__(self) -> DecodeStream:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncDecodeStream(_Stream, AsyncIterator[StreamChunk]):
    """The chunks of one decode for a coroutine (no thread per stream); ``async with``."""

    def __aiter__(self) -> AsyncDecodeStream:
        return self

    def _start(self) -> None:
        if self._open or self._ended:
            return
        if self._begin(asyncio.get_running_loop()) is None:
            return
        try:
            self._submitted(AsyncRequestStream(self._session._runtime, self._request,
                                               self._session.config.request_timeout))
        except LlamapyError as exc:
            self._pending.append(self._fail(exc))

    async def _prepare(self) -> None:
        """Before submission: read back what an earlier cancelled decode left in the KV,
        awaiting the engine (the blocking read-back is never run on the event loop)."""
        session = self._session
        if not self._open and not self._ended and session._stale and session._fatal is None:
            await session._async_generated()

    async def __anext__(self) -> StreamChunk:
        await self._prepare()
        self._start()
        if self._pending:
            return self._pending.pop(0)
        events = self._events
        if self._ended or not isinstance(events, AsyncRequestStream):
            raise StopAsyncIteration
        try:
            async for event in events:
                chunk = self._chunk(event)
                if chunk is not None:
                    return chunk
        except LlamapyError as exc:
            return self._fail(exc)
        except BaseException:  # the reading task was cancelled: so is the request
            self._end()
            raise
        self._end()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop reading (as :meth:`DecodeStream.close`)."""
        self._ended = self._ended or not self._open
        self._end()

    async def __aenter__(self) -> AsyncDecodeStream:
        await self._prepare()
        self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


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
    _watch: CallWatch | None
    num_decode_tokens: int

    if TYPE_CHECKING:  # defined by the session
        @property
        def resident(self) -> list[int]: ...

        @property
        def n_ctx(self) -> int: ...

        def _check(self) -> None: ...

        def _check_state(self) -> None: ...

        def _request(self, tokens: list[int], max_tokens: int, identity: str,
                     sampling: Any = None, speculative: Any = None,
                     progress: bool = False, request_id: Hashable | None = None,
                     media: tuple[MediaSpan, ...] = (),
                 checkpoint_hints: tuple[int, ...] = ()) -> Request: ...

    def _decode_request(self, config: DecodeConfig, request_id: Hashable | None = None, *,
                        read_back: bool = True) -> tuple[Request, DecodeRun]:
        """A decode's request on the resident state, validated. ``read_back=False`` (the async
        call) leaves a cancelled decode's tokens to be read back at submission."""
        if read_back:
            self._check()
        else:
            self._check_state()
        resident = self.resident
        if not resident:
            raise InvalidOptionError("decode needs a resident prefix or suffix", option="prefix")
        room = self.n_ctx - len(resident)
        max_tokens = config.max_tokens if config.max_tokens is not None else room
        if max_tokens > room or (room <= 0 and max_tokens != 0):
            raise ContextOverflowError(stage="decode", resident_tokens=len(resident),
                                       additional_tokens=max(1, max_tokens), n_ctx=self.n_ctx)
        tail = ""
        if config.parser_protocols and config.reasoning_format != "none":
            tail = self._host.detokenize(resident[-_TAIL_TOKENS:])
        run = DecodeRun(config, self._host.sampling, tail)
        request = self._request(resident, max_tokens, self._manifest.identity_digest,
                                run.sampling, config.speculative, request_id=request_id)
        return request, run

    def _on_event(self, event: Event, run: DecodeRun) -> StreamChunk | None:
        if isinstance(event, TokenEvent):
            self._generated.append(event.token_id)
            self.num_decode_tokens += 1
            return run.feed(event.text)
        if isinstance(event, DoneEvent):
            return run.finish(str(event.finish_reason))
        return None  # progress

    def _failed(self, exc: LlamapyError, stream: RequestStream | AsyncRequestStream | None
                ) -> StreamChunk:
        """The error chunk. A timeout or a cancel is not fatal (the generated tokens are read
        back before the next primitive); an engine error is, unless the request was refused
        before it generated anything (bad grammar, no room, queue full)."""
        if isinstance(exc, RequestCancelledError | RequestTimeoutError):
            self._stale = self._fatal is None
            reason = "cancelled" if isinstance(exc, RequestCancelledError) else "error"
            return StreamChunk(error=exc, finish_reason=reason)
        final = None if stream is None else stream.final
        harmless = isinstance(exc, _DECODE_SUBMIT_ERRORS) and (
            stream is None or (isinstance(final, ErrorEvent) and final.completion_tokens == 0))
        if not harmless:
            self._fatal = exc
        return StreamChunk(error=exc, finish_reason="error")

    def _ended(self, stream: RequestStream | AsyncRequestStream | None) -> None:
        """After a decode stream: one that did not finish normally cancels its request; the
        tokens that reached the KV meanwhile are read back before the next primitive
        (:meth:`_sync_generated`)."""
        self._busy = False
        self._watch = None
        if stream is None:
            return
        final = stream.final
        finished = isinstance(final, DoneEvent) and \
            final.finish_reason is not FinishReason.CANCELLED
        if not finished:
            stream.cancel()
            self._stale = self._stale or self._fatal is None

    def _sync_generated(self) -> None:
        """After a cancelled decode: read the lease's KV tokens (see :meth:`_apply_kv`)."""
        lease = self._lease
        self._apply_kv(self._runtime.call(lambda engine: engine.leases.tokens(lease)))

    async def _async_generated(self) -> None:
        lease = self._lease
        self._apply_kv(await self._runtime.acall(lambda engine: engine.leases.tokens(lease)))

    def _apply_kv(self, kv: list[int]) -> None:
        """The generated tokens are those in the lease's KV (the engine may have produced
        more than were read), or the tokens read when they are one sampled token ahead of
        the KV (that token's KV is computed by the next request)."""
        from llamapy.errors import SessionFatalError

        self._stale = False
        fixed, seen = self._prefix + self._suffix, self._generated
        if kv[:len(fixed)] != fixed:
            self._fatal = LlamapyError("the lease's KV no longer holds the session's prefix")
            raise SessionFatalError("session KV out of sync; close and reopen it")
        in_kv = kv[len(fixed):]
        if len(seen) == len(in_kv) + 1 and seen[:len(in_kv)] == in_kv:
            return
        self.num_decode_tokens += max(0, len(in_kv) - len(seen))
        self._generated = in_kv
