"""Stateful property test of pooled requests (a reranker's scoring) on the fake backend.

Rules submit pooled requests of random lengths (some longer than one batch) over a tiny token
alphabet (so prompts share prefixes and repeat), cancel and tick, on a pooling fake backend
with or without KV memory, under each built-in strategy, with a bounded queue. Checked after
every step:

- engine and backend integrity; the fake backend records no violation (every pooled segment
  is a whole sequence, every row an output);
- every request ends exactly once; one that finished has the pooled output of exactly its own
  prompt (no chunking, no reuse, no other request's tokens), and no decode held more than
  ``n_batch`` tokens;
- a prompt longer than one batch is ``ContextOverflowError`` at submit, a full queue
  ``QueueFullError``, and neither leaves anything behind;
- nothing waits for ever: under the first-come strategies a request on a slot is decoded
  within ``n_parallel`` ticks of its admission; under ``shortest_first`` within
  ``n_parallel`` ticks of having waited ``max_wait_s`` (shorter prompts may go first until
  then); a slot holds no KV once its request ended.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from llamapy.engine import EngineConfig, Request, RequestOptions, ShortestFirst
from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.fake.model import CostModel, fake_pooled, pooled_history
from llamapy.engine.request import DoneEvent
from llamapy.engine.states import RequestState
from llamapy.engine.testing import Recorder
from llamapy.errors import ContextOverflowError, QueueFullError

POOLED = RequestOptions(max_tokens=0)
MAX_WAIT_S = 0.01


class PooledMachine(RuleBasedStateMachine):
    """See the module docstring."""

    @initialize(n_parallel=st.integers(1, 4), n_batch=st.sampled_from([8, 16, 32]),
                strategy=st.sampled_from(["shortest_first", "decode_maximal",
                                          "prefill_priority", "balanced"]),
                memoryless=st.booleans())
    def setup(self, n_parallel: int, n_batch: int, strategy: str, memoryless: bool) -> None:
        self.backend = FakeBackend(n_ctx=256, n_seq_max=n_parallel, n_batch=n_batch, pools=True,
                                   memoryless=memoryless, record_plans=True,
                                   cost=CostModel(step_s=0.004, token_s=0.0005))
        chosen: object = ShortestFirst(MAX_WAIT_S) if strategy == "shortest_first" else strategy
        config = EngineConfig(n_parallel=n_parallel, n_batch=n_batch, batch_strategy=chosen,
                              max_queue=6)
        self.engine = Engine(self.backend, config, clock=self.backend.clock.now)
        self.aging = strategy == "shortest_first"
        self.n_batch, self.n_parallel = n_batch, n_parallel
        self.sinks: dict[str, tuple[list[int], Recorder]] = {}
        self.serial = 0
        self.ticks = 0
        #: Per request on a slot: the tick from which it must be decoded within n_parallel.
        self.due: dict[str, int] = {}

    @rule(length=st.integers(1, 36), alphabet=st.integers(1, 3), data=st.data())
    def submit(self, length: int, alphabet: int, data: st.DataObject) -> None:
        prompt = data.draw(st.lists(st.integers(0, alphabet), min_size=length,
                                    max_size=length))
        self.serial += 1
        rid, sink = f"r{self.serial}", Recorder()
        queue_was_full = len(self.engine.queue) >= 6  # (a new request never jumps the queue)
        try:
            self.engine.submit(Request(rid, prompt, POOLED, sink, pooled=True))
        except ContextOverflowError as exc:
            assert length > self.n_batch and exc.stage == "pool"
            return
        except QueueFullError:
            assert queue_was_full
            return
        assert length <= self.n_batch
        self.sinks[rid] = (prompt, sink)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        active = sorted(self.engine.runs)
        if active:
            rid = data.draw(st.sampled_from(active))
            assert self.engine.cancel(rid)

    @rule(n=st.integers(1, 3))
    def tick(self, n: int) -> None:
        for _ in range(n):
            if not self.engine.tick():
                return
            self.ticks += 1
            self._note_due()

    def _note_due(self) -> None:
        """Start each slot's deadline: at admission (first-come strategies) or once it has
        waited ``max_wait_s`` (``shortest_first``)."""
        now = self.engine.clock()
        for slot in self.engine.pool.running():
            run = slot.run
            if run is None or run.request_id in self.due:
                continue
            if not self.aging or now - run.admitted_at >= MAX_WAIT_S:
                self.due[str(run.request_id)] = self.ticks

    @invariant()
    def integrity(self) -> None:
        self.engine.check_integrity()
        self.backend.check_integrity()
        assert all(plan.n_tokens <= self.n_batch for plan in self.backend.plans)

    @invariant()
    def outputs(self) -> None:
        for rid, (prompt, sink) in self.sinks.items():
            finals = [e for e in sink.events if isinstance(e, DoneEvent) or e is sink.final]
            assert len(finals) <= 1
            if rid in self.engine.runs:
                assert sink.final is None
                continue
            assert sink.final is not None, f"{rid} left the engine without a final event"
            assert sink.finish_reason in ("prefill", "cancelled"), sink.final
            if sink.finish_reason == "prefill":
                assert isinstance(sink.final, DoneEvent)
                assert sink.final.pooled == fake_pooled(pooled_history(prompt))

    @invariant()
    def no_starvation(self) -> None:
        for rid, start in self.due.items():
            run = self.engine.runs.get(rid)
            if run is not None and run.state is not RequestState.QUEUED:
                assert self.ticks - start <= self.n_parallel, f"{rid} waits on its slot"

    @invariant()
    def free_slots_hold_nothing(self) -> None:
        for slot in self.engine.pool.slots:
            if slot.run is None:
                assert self.backend.seq_pos_max(slot.seq_id) == -1


TestPooledMachine = PooledMachine.TestCase
