"""Decode a batch, handle KV pressure, then sample and emit.

KV pressure (``KVCacheFullError``): purge idle slots' caches one at a time (least recently used
first, each offered to the RAM cache) and retry; then drop the batch's speculative drafts and
retry; when nothing is left to purge or drop, split the batch
in halves and decode each; an entry that still does not fit alone fails its run with
``ContextOverflowError`` and gives up its KV, so the others carry on. Any other decode error
fails the runs of the batch with that error, after trimming whatever the backend wrote past
each slot's known KV.

A decode entry carrying a draft is verified row by row (see
:mod:`llamapy.engine.speculation.speculator`): sampling goes on while the sampled token
equals the drafted one, then the rejected positions' KV is removed.

Sampling fails only the run it samples for: a typed error (a grammar that allows no token), a
foreign one (``EngineError``), or a sampler that took more than ``max_sample_ms`` of the tick
thread's CPU time for one token (``SamplingTooCostlyError``: a grammar that costly would stall
every slot at each of its tokens; the first such token is paid, not the next ones). CPU time,
not wall time, so a busy machine does not fail a request that would fit; the CPU clock is read
once a batch, and again only for a token past the bound in wall time.

Runs are only *marked* finished here (``run.end``: state ``ENDING``); the engine's reap phase
sends the final event and frees the slot.

On a backend whose decode only queues the step (``async_decode``: a GPU), the tick overlaps
the device: a sampled token that does not end its run (not end-of-generation, within
``max_tokens``, no draft) is appended at once, so the next step can be planned and queued,
and its text (detokenising, stop strings) and event are done after that step is queued, while
it computes (:meth:`Executor.flush`). A stop string found then ends the run; its row of the
step already queued is not sampled. :meth:`Executor.flush_run` sends a run's pending event
before anything else of it (its final event).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

from llamapy.engine.backend import Backend, BatchPlan, Sampler
from llamapy.engine.cache.resolver import PrefixResolver
from llamapy.engine.planner import Entry, ScheduledBatch
from llamapy.engine.request import Event, FinishReason, ProgressEvent, Run, TokenEvent
from llamapy.engine.slots import Slot
from llamapy.engine.speculation.speculator import Speculator, trim_to_run
from llamapy.engine.states import SlotState
from llamapy.engine.stats import Counters
from llamapy.errors import (
    ContextOverflowError,
    DecodeError,
    EngineError,
    KVCacheFullError,
    LlamapyError,
    SamplingTooCostlyError,
)

__all__ = ["Executor"]

#: A token's top log-probabilities, when its request asked for them.
Logprobs = tuple[tuple[int, float], ...] | None


class Executor:
    """Runs batches against the backend."""

    def __init__(self, backend: Backend, prefix: PrefixResolver, counters: Counters,
                 clock: Callable[[], float], deliver: Callable[[Run, Event], None],
                 speculator: Speculator, max_sample_s: float = math.inf) -> None:
        self.backend = backend
        #: A run whose sampler takes longer for one token fails (see ``max_sample_ms``).
        self.max_sample_s = max_sample_s
        self.speculator = speculator
        self.prefix = prefix
        self.counters = counters
        self.clock = clock
        self.deliver = deliver
        #: ``(tokens, start)`` of the last decode until its duration is recorded (_timed).
        self._step: tuple[int, float] | None = None
        #: This thread's CPU and wall clocks when the batch being sampled began.
        self._marks = (0.0, 0.0)
        #: Tokens sampled whose text and event wait for the next step to be queued.
        self._pending: list[tuple[Run, Slot, int, Logprobs]] = []

    def flush(self) -> None:
        """Do the text and event of every pending token (see the module)."""
        pending, self._pending = self._pending, []
        for run, slot, token, logprobs in pending:
            if not run.ending:
                self._emit(run, slot, token, logprobs)

    def flush_run(self, run: Run) -> None:
        """Do ``run``'s pending token first (before its final event)."""
        mine = [item for item in self._pending if item[0] is run]
        if mine:
            self._pending = [item for item in self._pending if item[0] is not run]
            for _, slot, token, logprobs in mine:
                if not run.ending:
                    self._emit(run, slot, token, logprobs)

    def execute(self, batch: ScheduledBatch,
                ahead: Callable[[ScheduledBatch], ScheduledBatch | None] | None = None
                ) -> ScheduledBatch | None:
        """Decode ``batch`` (splitting it under KV pressure), then sample and emit. ``ahead``
        is called while the step computes (before its outputs are read); what it returned,
        once the batch is committed (None when the batch was split or failed)."""
        now = self.clock()
        for entry in batch.entries:
            if entry.run.prefill_started_at is None:
                entry.run.prefill_started_at = now
                self._progress(entry.run)
        plan = self._decode(batch)
        self.flush()  # (the step is queued: the last one's text and events meanwhile)
        if plan is None:
            return None
        following = ahead(batch) if ahead is not None else None
        self.counters.num_decode_calls += 1
        self.counters.num_decode_slots += len(batch.entries)
        self._commit(batch, plan.output_indices())
        return following

    def _decode(self, batch: ScheduledBatch) -> BatchPlan | None:
        """Decode ``batch`` (purging, dropping drafts, splitting under KV pressure); its plan,
        None when it was split or failed (done here)."""
        plan = batch.plan if batch.plan is not None else batch.to_plan()
        if plan.adapter_set != self.backend.adapter_set:  # the backend switches its LoRA set
            self.counters.num_adapter_switches += 1
        while True:
            try:
                started = self.clock()
                self.backend.decode(plan)
                self._step = (plan.n_tokens, started)
                if not self.backend.async_decode:
                    self._timed()
                return plan
            except KVCacheFullError:
                self.counters.num_kv_pressure_events += 1
                if self.prefix.purge_one():
                    continue
                if _drop_drafts(batch):
                    plan = batch.to_plan()
                    continue
                self.flush()
                self._split_or_overflow(batch)
                return None
            except DecodeError as exc:
                self.flush()
                self._fail(batch, exc)
                return None

    def _split_or_overflow(self, batch: ScheduledBatch) -> None:
        if len(batch.entries) > 1:
            self.counters.num_batch_splits += 1
            for half in batch.split():
                self.execute(half)
            return
        entry = batch.entries[0]
        unified = self.backend.kv_unified
        self.counters.num_context_overflows += 1
        entry.run.end(FinishReason.ERROR, ContextOverflowError(
            stage="prefill" if entry.prefill else "decode",
            resident_tokens=len(entry.slot.cached), additional_tokens=len(entry.token_ids),
            n_ctx=self.backend.n_ctx if unified else self.backend.n_ctx_seq))
        self.prefix.discard(entry.slot, 0)  # its cells go to the requests that carry on

    def _fail(self, batch: ScheduledBatch, exc: DecodeError) -> None:
        for entry in batch.entries:
            self.prefix.resync(entry.slot)
            entry.run.end(FinishReason.ERROR, exc)

    def _commit(self, batch: ScheduledBatch, rows: list[int | None]) -> None:
        self._marks = (time.thread_time(), time.perf_counter())  # (see _too_costly)
        for entry, row in zip(batch.entries, rows, strict=True):
            entry.slot.cached.extend(entry.token_ids)
            run = entry.run
            if entry.prefill:
                self.counters.num_prefill_tokens += len(entry.token_ids)
                run.timings.prefill_tokens += len(entry.token_ids)
                self.prefix.write_pins(run)
                self.prefix.rewinder.take(run, entry.slot)
                self._progress(run)
            if run.whole_prefill:
                self._pool(entry)
            elif run.ending:  # a stop string found while this step computed: its row is moot
                continue
            elif row is not None and entry.draft:
                self._verify(entry, row)
            elif row is not None:
                self._sample(entry, row)
            elif run.prefill_only and entry.slot.remaining_prefill == 0:
                run.timings.prefill_s = self.clock() - (run.prefill_started_at or 0.0)
                run.end(FinishReason.PREFILL)

    def _pool(self, entry: Entry) -> None:
        """Read a pooled run's output (its whole prompt was this decode's), free its KV at
        once (it serves nothing after; a model without KV memory keeps none anyway) and end
        it."""
        run = entry.run
        try:
            run.pooled = tuple(float(x) for x in self.backend.pooled(entry.slot.seq_id))
            self._timed()
        except Exception as exc:  # (a foreign error fails this run only)
            run.end(FinishReason.ERROR,
                    exc if isinstance(exc, LlamapyError) else EngineError("pool", exc))
            return
        finally:
            self.prefix.trim(entry.slot, 0)
        now = self.clock()
        run.timings.prefill_s = now - (run.prefill_started_at or now)
        run.timings.ttft_s = now - run.submitted_at
        run.end(FinishReason.PREFILL)

    def _verify(self, entry: Entry, row: int) -> None:
        """Sample the rows of a drafted entry while they confirm the draft; trim the rest."""
        run, draft = entry.run, entry.draft
        first, accepted = row - len(draft), 0
        for i in range(len(draft) + 1):
            token = self._sample(entry, first + i, defer=False)
            matched = token is not None and i < len(draft) and token == draft[i]
            accepted += matched
            if not matched or run.ending:
                break
        trim_to_run(self.backend, run, entry.slot.seq_id, entry.slot.cached)
        self.speculator.verified(run, len(draft), accepted, entry.draft_bucket)

    def _sample(self, entry: Entry, row: int, *, defer: bool = True) -> int | None:
        """Sample, account and emit one token of ``entry`` from ``row`` (None: it failed);
        with ``defer`` on an asynchronous backend, a token that does not end the run is
        emitted at the next :meth:`flush` (see the module)."""
        run, slot = entry.run, entry.slot
        assert run.sampler is not None, "sampling a prefill-only run"
        started = time.perf_counter()
        try:
            token = run.sampler.sample(row)
            self._timed()
            n_probs = run.request.options.sampling.n_probs
            logprobs = _logprobs(run.sampler, row, token, n_probs) if n_probs else None
        except Exception as exc:  # e.g. a grammar with no allowed token: this run only
            run.end(FinishReason.ERROR,
                    exc if isinstance(exc, LlamapyError) else EngineError("sample", exc))
            return None
        if self._too_costly(started):  # it would stall every slot at each of its tokens
            run.end(FinishReason.ERROR, SamplingTooCostlyError(self.max_sample_s))
            return None
        run.tokens.append(token)
        self.counters.num_generated_tokens += 1
        self._time_token(run)
        if slot.state is SlotState.PREFILLING:
            slot.machine.fire("prefilled")
        if defer and self.backend.async_decode and not self.backend.is_eog(token) \
                and run.num_generated < run.request.options.max_tokens:
            self._pending.append((run, slot, token, logprobs))
        else:
            self._emit(run, slot, token, logprobs)
        return token

    def _timed(self) -> None:
        """Record the last decode's duration for the pass-cost fit (``speculator.cost``),
        once: its call on a synchronous backend; on an asynchronous one, until its first
        output was read (the call only queues the step, which costs the same for any size)."""
        if self._step is not None:
            n_tokens, started = self._step
            self._step = None
            self.speculator.cost.record(n_tokens, self.clock() - started)

    def _too_costly(self, started: float) -> bool:
        """Whether the sampling that began at ``started`` (``perf_counter``) took more than
        ``max_sample_s`` of this thread's CPU. CPU time never exceeds wall time, so the CPU
        clock (a system call) is read only past the bound in wall time: what this thread
        spent since :attr:`_marks` minus the wall time before ``started`` (at most what it
        spent then) is a lower bound of the sampling's CPU time."""
        now = time.perf_counter()
        if now - started <= self.max_sample_s:
            return False
        cpu, wall = self._marks
        self._marks = (time.thread_time(), now)
        return self._marks[0] - cpu - max(0.0, started - wall) > self.max_sample_s

    def _emit(self, run: Run, slot: Slot, token: int,
              logprobs: Logprobs) -> None:
        """The text and event of ``token`` (ending ``run`` at a stop, end or budget)."""
        text, reason = self._text_for(run, token)
        if reason is not None:
            run.end(reason)
        timings = None
        if run.request.options.timings_per_token:
            timings = replace(run.timings, completion_tokens=run.num_generated)
        self.deliver(run, TokenEvent(run.request_id, token, text, logprobs, timings,
                                     slot.slot_id))

    def _progress(self, run: Run) -> None:
        """A :class:`ProgressEvent` for a run that asked for them (``return_progress``)."""
        if not run.request.options.return_progress:
            return
        timings = run.timings
        computed = timings.prefill_tokens
        elapsed = self.clock() - (run.prefill_started_at or 0.0) if computed else 0.0
        snapshot = replace(timings, prefill_s=elapsed, completion_tokens=run.num_generated)
        self.deliver(run, ProgressEvent(run.request_id, len(run.prompt), timings.reused_tokens,
                                        timings.reused_tokens + computed, snapshot))

    def _time_token(self, run: Run) -> None:
        now = self.clock()
        timings = run.timings
        if timings.ttft_s is None:
            timings.ttft_s = now - run.submitted_at
            timings.prefill_s = now - (run.prefill_started_at or now)
        else:
            timings.decode_s = now - (run.submitted_at + timings.ttft_s)
        run.last_token_at = now

    def _text_for(self, run: Run, token: int) -> tuple[str, FinishReason | None]:
        if self.backend.is_eog(token):
            return run.text.flush(), FinishReason.EOG
        special = token in run.request.options.preserved_tokens
        text, stopped = run.text.push(self.backend.token_to_piece(token, special))
        if stopped:
            return text, FinishReason.STOP
        if run.num_generated >= run.request.options.max_tokens:
            return text + run.text.flush(), FinishReason.MAX_TOKENS
        return text, None


def _drop_drafts(batch: ScheduledBatch) -> bool:
    """Remove every draft from ``batch``; False when it had none."""
    dropped = False
    for entry in batch.entries:
        if entry.draft:
            entry.token_ids = entry.token_ids[:len(entry.token_ids) - len(entry.draft)]
            entry.draft, entry.draft_tag, dropped = [], None, True
    return dropped


def _logprobs(sampler: Sampler, row: int, token: int, n: int) -> tuple[tuple[int, float], ...]:
    """The top ``n`` pairs of ``row``, plus the sampled token's own when it is not among them."""
    top = list(sampler.top_logprobs(row, n))
    if all(t != token for t, _ in top):
        top.append((token, sampler.token_logprob(row, token)))
    return tuple(top)
