"""Steady decode on an asynchronous device: the next step planned while this one computes.

On a backend whose decode only queues the step (``async_decode``: a GPU), every microsecond
between reading step N's outputs and queueing step N+1 is a microsecond the device idles. In
the steady state of serving, where every running slot decodes one token a step and nothing
else changes, the tick's planning (admission, prefix resolution, the strategy, the batch's
layout) would decide the same batch again with each slot one position on. So the engine
chains such steps inside one tick:

1. while step N computes, :func:`ahead` lays out step N+1: the same slots, each one position
   on, its token a placeholder (the backend's plan built too, sharing the token lists);
2. step N's outputs are sampled and committed as ever;
3. :func:`fill` puts each run's sampled token in place; when any run ended, stopped sampling
   or moved (an end-of-generation, a stop string, ``max_tokens``, an error), the chain stops
   and the tick ends as usual (its reap, then a full tick).

A chain only starts where nothing else could change the next batch: every running slot in a
plain decode batch (no prefill, draft, media or pooling), no queued or cancelled run, one
adapter set, a strategy that decodes every slot. What can change it arrives between ticks
(submissions, cancellations, KV commands), so the engine's owner says when to stop
(``keep_going``: its inbox is empty), and a chain is at most ``steady_steps`` steps long.
Nothing here touches the KV: every KV mutation still happens after a step's outputs are read.
"""

from __future__ import annotations

from collections.abc import Callable

from llamapy.engine.executor import Executor
from llamapy.engine.planner import Entry, ScheduledBatch
from llamapy.engine.stats import Counters

__all__ = ["SteadyChain", "ahead", "fill", "plain_decode"]


class SteadyChain:
    """Executes a tick's batch, then the steady steps after it (see the module)."""

    def __init__(self, executor: Executor, counters: Counters, max_steps: int) -> None:
        self.executor = executor
        self.counters = counters
        #: Steps a tick may chain after its own (``EngineTuning.steady_steps``).
        self.max_steps = max_steps

    def execute(self, batch: ScheduledBatch, may_chain: bool, keep_going: Callable[[], bool]
                ) -> None:
        """Execute ``batch``; when ``may_chain`` (the engine's conditions, see the module) and
        it is a plain decode, chain the steps after it while ``keep_going()``."""
        steps = self.max_steps if may_chain and plain_decode(batch) else 0
        following = self.executor.execute(batch, ahead if steps else None)
        while following is not None and steps and keep_going() and fill(following):
            steps -= 1
            self.counters.num_steady_steps += 1
            following = self.executor.execute(following, ahead if steps else None)


def plain_decode(batch: ScheduledBatch) -> bool:
    """Whether every entry of ``batch`` decodes one token of a sampling run (no prefill,
    draft, media or pooled run, no speculation to come)."""
    for entry in batch.entries:
        spec = entry.run.spec
        if entry.prefill or entry.draft or not entry.samples or entry.media is not None \
                or entry.run.whole_prefill or (spec is not None and spec.active):
            return False
    return True


def ahead(batch: ScheduledBatch) -> ScheduledBatch:
    """The batch after the plain decode ``batch``: each entry one position on, its token a
    placeholder until :func:`fill`; its backend plan built now (it shares the token lists)."""
    entries = [Entry(e.slot, e.run, [0], e.start_pos + 1, prefill=False, samples=True)
               for e in batch.entries]
    following = ScheduledBatch(entries, batch.adapter_set)
    following.plan = following.to_plan()
    return following


def fill(batch: ScheduledBatch) -> bool:
    """Put each run's last sampled token into ``batch`` (from :func:`ahead`); False, changing
    nothing that matters, when a run no longer decodes there (it ended, or did not sample)."""
    for entry in batch.entries:
        run, slot = entry.run, entry.slot
        if run.ending or run.slot is not slot or len(slot.cached) != entry.start_pos \
                or len(run.tokens) != entry.start_pos + 1:
            return False
    for entry in batch.entries:
        entry.token_ids[0] = entry.run.tokens[-1]
    return True
