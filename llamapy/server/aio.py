"""The asyncio half of ``Server``: the ``a*`` twins of its blocking calls.

Nothing here blocks the event loop: a call made while the model loads awaits the load (within
its ``timeout``) through :class:`~llamapy.server.calls.ReadySignal`, events arrive through the
runtime's per-loop mailbox, and opening a session runs on a worker thread. Cancelling the task
that awaits a call cancels its request, and :class:`asyncio.CancelledError` propagates
unchanged; a request cancelled otherwise raises
:class:`~llamapy.errors.RequestCancelledError`, which is not an ``asyncio.CancelledError``.
(``aopen_session`` lives with ``open_session`` in :mod:`llamapy.server.core`.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..runtime import (
    AsyncEventStream,
    AsyncRequestStream,
    AsyncTextChunks,
    Collector,
    Completion,
)
from .calls import Call, prompt_ids
from .core import ServerCore
from .intent import GenerationIntent

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..options.typed import GenerationOptions

__all__ = ["AsyncMethods"]


class AsyncMethods(ServerCore):
    """The asyncio API of :class:`~llamapy.server.Server` (see the module docstring)."""

    def open_astream(self, token_ids: Sequence[int], intent: GenerationIntent | None = None, *,
                     per_event: bool = True, **options: Unpack[GenerationOptions]
                     ) -> AsyncRequestStream:
        """Low-level async ``open_stream``: submit now (call it inside a running event loop;
        it does not wait for a model still loading: the request queues behind the load)."""
        call = self._prepare(intent, options, per_event=per_event)
        return AsyncRequestStream(self._loop, call.request(token_ids), call.timeout,
                                  per_event=per_event, deadline=call.deadline)

    async def acomplete_tokens(self, token_ids: Sequence[int],
                               intent: GenerationIntent | None = None,
                               **options: Unpack[GenerationOptions]) -> Completion:
        """Async ``complete_tokens``: ``timeout`` (default 60 s) bounds the whole call, the
        wait for the load included; cancelling the task cancels the request."""
        call = self._prepare(intent, options, per_event=False)
        ids = prompt_ids(token_ids)
        await self._await_loaded(call.left(), call.timeout)
        return await self._acollect(call, ids)

    async def acomplete(self, prompt: str, **options: Unpack[GenerationOptions]) -> Completion:
        """Async ``complete`` (the load, tokenizing and generation within ``timeout``)."""
        call = self._prepare(None, options, per_event=False)
        await self._await_loaded(call.left(), call.timeout)
        return await self._acollect(call, self.fetch_model().tokenize(prompt, True, True))

    async def agenerate(self, prompt: str, **options: Unpack[GenerationOptions]) -> str:
        """Async ``generate``."""
        return (await self.acomplete(prompt, **options)).text

    async def agenerate_tokens(self, token_ids: Sequence[int],
                               **options: Unpack[GenerationOptions]) -> str:
        """Async ``generate_tokens``."""
        return (await self.acomplete_tokens(token_ids, **options)).text

    async def _acollect(self, call: Call, token_ids: Sequence[int]) -> Completion:
        collector = Collector(len(token_ids))
        async with AsyncRequestStream(self._loop, call.request(token_ids), call.timeout,
                                      per_event=False, deadline=call.deadline) as events:
            async for event in events:
                done = collector.add(event)
                if done is not None:
                    return done
        raise AssertionError("request ended without a final event")

    async def acomplete_all(
            self, calls: Sequence[tuple[Sequence[int], GenerationIntent | Mapping[str, Any]]]
    ) -> list[Completion]:
        """Several requests that live and die together (``n`` choices, several prompts): they
        run concurrently; the first to fail (``QueueFullError``, ...) cancels the others at
        once and is raised, and cancelling the caller cancels them all. Each call is token ids
        with a :class:`~llamapy.server.GenerationIntent` or a mapping of keyword options.

        Refused before any is submitted (``InvalidOptionError`` naming ``n``): more than
        ``max_choices`` requests, or more than the slots plus the queue could ever hold."""
        self.check_fits_at_once(len(calls))
        tasks = [asyncio.ensure_future(self._acomplete_one(ids, how)) for ids, how in calls]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def _acomplete_one(self, token_ids: Sequence[int],
                       how: GenerationIntent | Mapping[str, Any]) -> Awaitable[Completion]:
        if isinstance(how, GenerationIntent):
            return self.acomplete_tokens(token_ids, how)
        return self.acomplete_tokens(token_ids, **how)

    def aevents(self, token_ids: Sequence[int], intent: GenerationIntent | None = None,
                **options: Unpack[GenerationOptions]) -> AsyncEventStream:
        """Async ``events``: an :class:`~llamapy.runtime.AsyncEventStream`, submitted at
        its first iteration (or ``async with`` entry)."""
        call = self._prepare(intent, options, per_event=True)
        ids = prompt_ids(token_ids)
        return self._async_events(call, lambda: ids)

    def astream_tokens(self, token_ids: Sequence[int],
                       **options: Unpack[GenerationOptions]) -> AsyncTextChunks:
        """Async ``stream_tokens``: an :class:`~llamapy.runtime.AsyncTextChunks` with
        ``request_id``, ``cancel()``, ``aclose()`` and ``async with``."""
        return AsyncTextChunks(self.aevents(token_ids, **options))

    def astream(self, prompt: str, **options: Unpack[GenerationOptions]) -> AsyncTextChunks:
        """Async ``stream``: the prompt is tokenized at the first iteration, once the model
        has loaded (that wait bounded by the per-chunk ``timeout``)."""
        call = self._prepare(None, options, per_event=True)
        return AsyncTextChunks(self._async_events(
            call, lambda: self.fetch_model().tokenize(prompt, True, True)))

    def _async_events(self, call: Call, tokens: Callable[[], Sequence[int]]
                      ) -> AsyncEventStream:
        async def prepare() -> Callable[[], AsyncRequestStream]:
            await self._await_loaded(call.timeout, call.timeout)
            request = call.request(tokens())
            return lambda: AsyncRequestStream(self._loop, request, call.timeout)
        return AsyncEventStream(call.request_id, prepare, self._pending)
