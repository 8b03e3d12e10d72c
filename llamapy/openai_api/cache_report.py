"""How much a response says about prefix reuse: ``exact``, ``coarse`` or ``off``
(``--cache-report``, :attr:`~.target.ServedModel.cache_report`).

Every number a response gives about reuse (``timings.cache_n``,
``usage.prompt_tokens_details.cached_tokens``, Responses' ``input_tokens_details``,
Anthropic's ``cache_read_input_tokens`` and ``cache_creation_input_tokens``, the
``X-Llamapy-Cache-*`` and ``X-Llamapy-Prompt-Computed`` headers, ``cache_diverged_at``,
``prompt_progress``, the timings of ``timings_per_token`` and of streams' final and usage
chunks) is derived from the engine's
:class:`~llamapy.engine.RequestTimings` and :class:`~llamapy.engine.ProgressEvent`. Exact
counts are an oracle: how many leading tokens of a guessed prompt matched an earlier request
in the same scope, one token at a time. So the served model passes every event and completion
through :func:`reported_event` / :func:`reported_completion` before any of those is made:

- ``exact``: the engine's counts, unchanged.
- ``coarse``: tokens matched (reused, and adopted in flight) are rounded down to a multiple
  of :data:`REPORT_BLOCK` (128, the step OpenAI reports cached tokens in); the tokens that
  hides are reported as computed (``prompt_n`` = prompt - reported reuse - reported in-flight
  reuse), so what ``cache_diverged_at`` and ``prompt_progress`` say follows from the rounded
  count; ``cache_source`` is dropped: which tier won tells whether another prefix matched
  more than one the caller knows (its own slot's), a comparison finer than a block.
- ``off``: nothing matched, as far as any response says (0, no source).

What neither can hide, and a deployment whose tenants share a scope should know: time.
``prompt_ms``, ``ttft_ms`` and the prompt rate follow the tokens really computed, and
``prompt_progress`` events come one per computed chunk, so their number and pace tell the
computed count to about a chunk. The slot a request lands on (``id_slot``) may follow the
longest match. ``/metrics``, ``/slots`` and the live view's counters are not responses to a
request and are not changed here (keep them from such tenants).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Iterator
from dataclasses import replace
from typing import TypeVar

from ..engine import ProgressEvent, RequestTimings, StreamEvent
from ..errors import InvalidOptionError
from ..options.reports import CACHE_REPORTS, REPORT_BLOCK
from ..runtime import AsyncRequestStream, RequestStream
from ..server import Completion

__all__ = ["CACHE_REPORTS", "REPORT_BLOCK", "AsyncReportedEvents", "ReportedEvents",
           "check_cache_report", "reported_completion", "reported_event", "reported_timings"]


E = TypeVar("E", bound=StreamEvent)


def check_cache_report(mode: object) -> str:
    """``mode`` if it is one of :data:`CACHE_REPORTS`, else :class:`InvalidOptionError`."""
    if mode not in CACHE_REPORTS:
        raise InvalidOptionError(f"cache_report must be one of {CACHE_REPORTS}, got {mode!r}",
                                 option="cache_report")
    return str(mode)


def _shown(tokens: int, mode: str) -> int:
    """A count of matched tokens as ``mode`` shows it."""
    if mode == "off":
        return 0
    if mode == "coarse":
        return tokens - tokens % REPORT_BLOCK
    return tokens


def reported_timings(timings: RequestTimings, mode: str) -> RequestTimings:
    """``timings`` as ``mode`` reports them (the same object for ``exact``): reuse and
    in-flight reuse shown by :func:`_shown` (their sum rounded, not each), the tokens hidden
    counted as computed, the source and any context checkpoint kept only by ``exact``, and no
    tokens reported as written to a pinned prefix (whether a prefix was pinned already says
    another request sent it)."""
    if mode == "exact":
        return timings
    matched = timings.reused_tokens + timings.inflight_tokens
    reused = _shown(timings.reused_tokens, mode)
    inflight = _shown(matched, mode) - reused
    hidden = matched - reused - inflight
    return replace(timings, reused_tokens=reused, inflight_tokens=inflight, reuse_source=None,
                   prefill_tokens=timings.prefill_tokens + hidden, pinned_tokens=0,
                   checkpoint_tokens=0, checkpoint_behind=0)


def _reported_progress(event: ProgressEvent, mode: str) -> ProgressEvent:
    """A progress event as ``mode`` reports it: the hidden tokens count as computed only once
    the whole prompt is in (before, ``processed`` is the shown reuse plus the tokens computed
    so far, which says nothing about the hidden count but the number of chunks)."""
    actual = event.timings
    shown = reported_timings(actual, mode)
    if event.processed + actual.inflight_tokens < event.total:
        shown = replace(shown, prefill_tokens=actual.prefill_tokens)
    return replace(event, cache=shown.reused_tokens,
                   processed=shown.reused_tokens + shown.prefill_tokens, timings=shown)


def reported_event(event: E, mode: str) -> E:
    """An engine event as ``mode`` reports it (the event itself for ``exact``)."""
    if mode == "exact":
        return event
    if isinstance(event, ProgressEvent):
        return _reported_progress(event, mode)  # type: ignore[return-value]
    timings = event.timings
    return event if timings is None else replace(event, timings=reported_timings(timings, mode))


def reported_completion(completion: Completion, mode: str) -> Completion:
    """A finished request as ``mode`` reports it (``usage.cached_tokens`` included)."""
    if mode == "exact":
        return completion
    timings = reported_timings(completion.timings, mode)
    return replace(completion, timings=timings,
                   usage=replace(completion.usage, cached_tokens=timings.reused_tokens))


class ReportedEvents(Iterator[StreamEvent]):
    """A request's event stream with each event as ``mode`` reports it (closing it, or
    :meth:`cancel`, cancels the request, as the stream's own)."""

    def __init__(self, events: RequestStream, mode: str) -> None:
        self.events = events
        self.mode = mode

    @property
    def request_id(self) -> Hashable:
        """The engine request's id."""
        return self.events.request_id

    def __iter__(self) -> ReportedEvents:
        return self

    def __next__(self) -> StreamEvent:
        return reported_event(next(self.events), self.mode)

    def cancel(self) -> None:
        """Cancel the request if it is still running."""
        self.events.cancel()

    close = cancel


class AsyncReportedEvents(AsyncIterator[StreamEvent]):
    """The asyncio form of :class:`ReportedEvents`."""

    def __init__(self, events: AsyncRequestStream, mode: str) -> None:
        self.events = events
        self.mode = mode

    @property
    def request_id(self) -> Hashable:
        """The engine request's id."""
        return self.events.request_id

    def __aiter__(self) -> AsyncReportedEvents:
        return self

    async def __anext__(self) -> StreamEvent:
        return reported_event(await self.events.__anext__(), self.mode)

    def cancel(self) -> None:
        """Cancel the request if it is still running."""
        self.events.cancel()

    async def aclose(self) -> None:
        """Cancel the request if it is still running."""
        self.events.cancel()
