"""Stateful property test of the engine on the fake backend.

Rules submit (tiny token alphabet so prefixes collide; random scope, identity, adapter set,
session, cache_prompt, max_tokens, stop strings, ``speculative`` override, a pinned
``slot_id``), cancel, drop a consumer, tick, inject faults, lease / use / release slots, and
restart an idle engine on the same disk prompt cache folder. Speculation is on in most setups:
the n-gram drafter (audited: every draft is text of the request's own cache key) or an oracle
drafter proposing the true continuation corrupted at a random rate. Invariants are checked after
every step, KV accounting after every tick, so after every verification (every plan runs one
adapter set and stays within ``n_batch``; every slot reads only KV written under its run's key
and computed under its run's adapter set; every draft was proposed from the request's own key);
every finished request is compared with the reference oracle for its adapter set; teardown ticks
to idle and checks liveness."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from engine.spec_helpers import AuditedNgramDrafter, OracleDrafter  # tests/engine
from engine_machine_setup import (
    ADAPTER_SETS,
    CACHE_PINS,
    FAULTS,
    IDENTITIES,
    IMAGES,
    PREFIXES,
    SCOPES,
    SPECULATIVE,
    STOPS,
    Shadow,
    ShortestPromptFirst,
    check_oracle,
    check_plans,
    engine_setups,
    report_events,
)
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from llamapy.engine import (
    CostModel,
    EngineConfig,
    EngineTuning,
    Request,
    RequestOptions,
    SamplingParams,
)
from llamapy.engine.cache.disk import CacheNamespace
from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import DeviceCost, FakeBackend
from llamapy.engine.fake.media import fake_media_chunk
from llamapy.engine.media import MediaSpan
from llamapy.engine.states import SlotState
from llamapy.engine.testing import drain
from llamapy.errors import (
    ContextOverflowError,
    DecodeError,
    InvalidOptionError,
    LlamapyError,
    QueueFullError,
)


class EngineMachine(RuleBasedStateMachine):
    """See the module docstring."""

    requests = Bundle("requests")
    leases = Bundle("leases")

    @initialize(setup=engine_setups())
    def start(self, setup: dict) -> None:
        self.setup = setup
        self.folder = tempfile.mkdtemp(prefix="llamapy-disk-") if setup["disk_mb"] else None
        self._build()
        self.shadows: dict[int, Shadow] = {}
        self.checked: set[int] = set()
        self.next_id = 0
        self.num_faults = 0
        self.num_ngram_proposed = 0

    def _build(self) -> None:
        setup = self.setup
        self.backend = FakeBackend(
            n_ctx=setup["n_ctx"], n_seq_max=setup["n_parallel"], n_batch=64,
            kv_unified=setup["unified"], supports_partial_removal=setup["partial"],
            state_bytes_per_token=32, record_plans=True,
            cost=CostModel(step_s=0.01, token_s=0.003),
            device=DeviceCost(0.0) if setup["device"] else None)
        strategy = setup["strategy"]
        config = EngineConfig(
            n_parallel=setup["n_parallel"], n_batch=setup["n_batch"],
            chunk_size=setup["chunk_size"], max_queue=setup["max_queue"],
            cache_prompt=setup["cache_prompt"], kv_unified=setup["unified"],
            prompt_cache_ram_mb=setup["ram_mb"], prompt_cache_dir=self.folder,
            prompt_cache_disk_mb=setup["disk_mb"],
            batch_strategy=ShortestPromptFirst() if strategy == "shortest_prompt_first"
            else strategy, spec_type=setup["spec"],
            spec_draft_n_max=setup["spec_n_max"], spec_adaptive=setup["spec_adaptive"],
            spec_max_streams=setup["spec_max_streams"], ctx_checkpoints=setup["ctx_checkpoints"],
            ctx_checkpoints_mb=setup["checkpoints_mb"],
            checkpoint_min_step=setup["checkpoint_step"])
        tuning = EngineTuning(ram_min_tokens=4, follow_min_tokens=2, instability_min_history=12,
                              inflight_dedup=setup["dedup"], disk_min_tokens=4,
                              disk_background=False)
        self.oracle = OracleDrafter(self.backend.model, setup["spec_error_rate"])
        self.ngram = AuditedNgramDrafter()
        self.engine = Engine(self.backend, config, tuning=tuning, clock=self.backend.clock.now,
                             drafters={"draft": self.oracle, "ngram": self.ngram},
                             cache_namespace=CacheNamespace("fake"))

    # --- rules ---------------------------------------------------------------------------------

    @rule(target=requests, prefix=st.sampled_from(PREFIXES),
          tail=st.lists(st.integers(1, 3), max_size=10), max_tokens=st.integers(0, 7),
          seed=st.integers(0, 3), greedy=st.booleans(), scope=st.sampled_from(SCOPES),
          identity=st.sampled_from(IDENTITIES), adapters=st.sampled_from(ADAPTER_SETS),
          session=st.sampled_from([None, 1, 2]),
          cache_prompt=st.sampled_from([None, None, True, False]), stop=st.sampled_from(STOPS),
          speculative=st.sampled_from(SPECULATIVE),
          slot_id=st.sampled_from([None, None, None, 0, 1, 3]),
          pins=st.sampled_from(CACHE_PINS))
    def submit(self, prefix, tail, max_tokens, seed, greedy, scope, identity, adapters, session,
               cache_prompt, stop, speculative, slot_id, pins):
        prompt = prefix + tail
        if not prompt:
            prompt = [1]
        options = RequestOptions(max_tokens=max_tokens, cache_scope=scope, session=session,
                                 cache_prompt=cache_prompt, stop=stop, adapters=adapters,
                                 speculative=speculative, slot_id=slot_id, cache_pins=pins,
                                 sampling=SamplingParams(seed=seed, temp=0.0 if greedy else 0.8))
        return self._submit(prompt, options, identity, None)

    @rule(target=requests, prefix=st.sampled_from(PREFIXES), image=st.sampled_from(IMAGES),
          tail=st.lists(st.integers(1, 3), max_size=6), max_tokens=st.integers(0, 5),
          scope=st.sampled_from(SCOPES), seed=st.integers(0, 2),
          speculative=st.sampled_from(SPECULATIVE), causal=st.booleans())
    def submit_media(self, prefix, image, tail, max_tokens, scope, seed, speculative, causal):
        """A prompt with an image (few distinct images, so one comes again at the same place
        and its KV is reused, while another at that place must not be): its rows are decoded
        from its embeddings, never mixed with text in one entry, and the answer is the
        oracle's for the prompt's media token ids. A chunk that is not causal is decoded whole
        in one decode (refused when it cannot fit one)."""
        chunk = fake_media_chunk(image, causal=causal)
        if not causal and chunk.n_tokens > self.engine.n_batch:
            with pytest.raises(InvalidOptionError, match="n_batch"):
                self.engine.submit(Request(-1, [*prefix, *chunk.token_ids, 1],
                                           RequestOptions(), media=(MediaSpan(len(prefix),
                                                                              chunk),)))
            return multiple()
        if not tail and max_tokens > 0:
            tail = [1]  # a prompt that samples ends with text
        prompt = [*prefix, *chunk.token_ids, *tail]
        options = RequestOptions(max_tokens=max_tokens, cache_scope=scope,
                                 speculative=speculative, sampling=SamplingParams(seed=seed))
        return self._submit(prompt, options, "", None, (MediaSpan(len(prefix), chunk),))

    @rule(target=requests, prefix=st.sampled_from(PREFIXES[1:]), n=st.integers(2, 4),
          tails=st.lists(st.integers(1, 3), min_size=4, max_size=4),
          max_tokens=st.integers(1, 4), scope=st.sampled_from(SCOPES),
          adapters=st.lists(st.sampled_from(ADAPTER_SETS), min_size=4, max_size=4))
    def submit_wave(self, prefix, n, tails, max_tokens, scope, adapters):
        """Several requests sharing a prefix at once (in-flight dedup, possibly across adapter
        sets, which must not share KV)."""
        ids = []
        for i in range(n):
            options = RequestOptions(max_tokens=max_tokens, cache_scope=scope,
                                     adapters=adapters[i], sampling=SamplingParams(seed=i))
            ids.extend(self._submit(prefix + tails[: i + 1], options, "", None).values)
        return multiple(*ids)

    @rule(target=requests, lease=leases, extra=st.lists(st.integers(1, 3), max_size=6),
          keep=st.integers(0, 30), max_tokens=st.sampled_from([0, 0, 2, 5]),
          other_set=st.sampled_from([None, None, None, (("b.gguf", 0.5),)]))
    def submit_on_lease(self, lease, extra, keep, max_tokens, other_set):
        """A request on a lease, usually under the lease's adapter set."""
        lease_id, scope, identity, adapters = lease
        if lease_id not in self.engine.pool.leases:
            return multiple()
        resident = self.engine.leases.tokens(lease_id)[:keep]
        prompt = resident + extra or [2]
        options = RequestOptions(max_tokens=max_tokens, cache_scope=scope,
                                 adapters=adapters if other_set is None else other_set,
                                 sampling=SamplingParams(seed=7, temp=0.8))
        media_held = any(t < 0 for t in prompt)  # media rows the lease holds: no span needed
        other_key = other_set is not None and other_set != adapters
        if media_held and (other_key or (prompt[-1] < 0 and max_tokens > 0)):
            with pytest.raises(InvalidOptionError):  # not its KV, or nothing after the media
                self.engine.submit(Request(-1, prompt, options, cache_identity=identity,
                                           lease_id=lease_id))
            return multiple()
        return self._submit(prompt, options, identity, lease_id)

    @rule(target=requests, rid=requests, move=st.booleans())
    def resubmit(self, rid, move):
        """A finished request's prompt and sampling again, in its scope or another: the n-gram
        pool may have learned its text, proposable within its cache key only."""
        shadow = self.shadows[rid]
        if shadow.sink.final is None or (not shadow.media and min(shadow.prompt) < 0):
            return multiple()  # (a lease's request held media rows without their embeddings)
        scope = shadow.key[0]
        if move:
            scope = "b" if scope != "b" else None
        options = RequestOptions(max_tokens=shadow.max_tokens, cache_scope=scope,
                                 stop=shadow.stop, adapters=shadow.adapters,
                                 speculative="ngram", sampling=shadow.params)
        return self._submit(shadow.prompt, options, shadow.key[1], None, shadow.media)

    def _submit(self, prompt, options, identity, lease_id, media=()):
        rid, self.next_id = self.next_id, self.next_id + 1
        shadow = Shadow(rid, prompt, options.max_tokens, options.sampling, options.stop,
                        options.adapters, (options.cache_scope, identity, options.adapters),
                        media=media)
        overflow = len(prompt) + options.max_tokens > self.backend.n_ctx_seq
        full = self._queue_full_for(lease_id, options.slot_id)
        request = Request(rid, prompt, options, shadow.sink, identity, lease_id, media=media)
        try:
            self.engine.submit(request)
        except ContextOverflowError as exc:
            assert overflow and exc.stage == "admit"
            return multiple()
        except QueueFullError:
            assert full and not overflow, "QueueFullError although the queue is not full"
            return multiple()
        assert not overflow and not full, "accepted although it had to be rejected"
        self.shadows[rid] = shadow
        return multiple(rid)

    def _queue_full_for(self, lease_id, slot_id=None) -> bool:
        engine = self.engine
        max_queue = engine.config.max_queue
        if max_queue == 0 or len(engine.queue) < max_queue:
            return False
        if any(r.request.lease_id == lease_id for r in engine.queue):
            return True
        if lease_id is not None:
            return engine.pool.leased_slot(lease_id).state is not SlotState.LEASED
        if slot_id is not None:  # pinned: only its own slot will do
            return not engine.pool.slots[slot_id % len(engine.pool.slots)].is_idle
        return not engine.pool.idle()

    @rule(rid=requests)
    def cancel(self, rid):
        was_active = rid in self.engine.runs
        assert self.engine.cancel(rid) == was_active
        assert rid not in self.engine.runs
        if was_active:
            assert self.shadows[rid].sink.finish_reason == "cancelled"

    @rule(rid=requests)
    def drop_consumer(self, rid):
        self.shadows[rid].sink.gone = True

    @rule(n=st.integers(1, 4))
    def tick(self, n):
        for _ in range(n):
            steps = self.engine.counters.num_draft_steps
            chained = self.engine.counters.num_steady_steps
            self.engine.tick()
            if self.engine.counters.num_steady_steps != chained:
                event("steady decode chained (async device)")
            self._check_batches()
            if self.engine.counters.num_draft_steps != steps:  # a verification: KV trimmed
                self._check_kv()

    @precondition(lambda self: self.num_faults < 2)
    @rule(kind=st.sampled_from(FAULTS), later=st.integers(0, 3))
    def inject_fault(self, kind, later):
        self.num_faults += 1
        at = None if kind in ("restore_fail", "sample_error") else \
            self.backend.num_decode_calls + 1 + later
        self.backend.inject(kind, at_call=at, seconds=1.0)

    @rule(target=leases, scope=st.sampled_from([None, "a"]), identity=st.sampled_from(["", "x"]),
          adapters=st.sampled_from(ADAPTER_SETS))
    def lease(self, scope, identity, adapters):
        idle_before = len(self.engine.pool.idle())
        lease_id = self.engine.lease(scope, identity, adapters)
        assert (lease_id is None) == (idle_before == 0)
        if lease_id is None:
            return multiple()
        return (lease_id, scope, identity, adapters)

    @rule(lease=leases, op=st.sampled_from(["clear", "roundtrip", "logits"]))
    def lease_kv_op(self, lease, op):
        """A session's KV operation on a free leased slot (engine-owned: the slot stays exact,
        which the integrity invariant checks after every step)."""
        lease_id, _, identity, _ = lease
        slot = self.engine.pool.slots[self.engine.pool.leases[lease_id]] \
            if lease_id in self.engine.pool.leases else None
        if slot is None or not slot.is_free:
            return
        ops = self.engine.leases
        event(f"lease op: {op}")
        if op == "clear":
            ops.clear(lease_id)
            assert ops.tokens(lease_id) == []
        elif op == "roundtrip":
            state = ops.save(lease_id)
            ops.clear(lease_id)
            restored = ops.restore(lease_id, state, cache_identity=identity)
            assert ops.tokens(lease_id) == (list(state.token_ids) if restored else [])
        elif ops.tokens(lease_id) and self.backend.supports_partial_removal:
            tokens = ops.tokens(lease_id)
            try:
                logits = ops.next_token_logits(lease_id, tokens)
            except DecodeError:
                return  # an injected fault: the KV was resynced (checked by the invariant)
            greedy = self.backend.model.reference(tokens, 1, SamplingParams(temp=0.0),
                                                  slot.key.adapter_set)[0]
            assert max(range(len(logits)), key=logits.__getitem__) == greedy
            assert ops.tokens(lease_id) == tokens

    @rule(lease=consumes(leases))
    def release(self, lease):
        lease_id = lease[0]
        if lease_id in self.engine.pool.leases:
            self.engine.release(lease_id)
            assert lease_id not in self.engine.pool.leases

    @rule()
    def restart(self):
        """Close the engine, once idle (its prefixes persist to disk), and start a fresh engine
        and backend on the same folder (a no-op without a disk cache or while busy)."""
        if self.folder is None or self.engine.runs or self.engine.pool.leases:
            return
        event("restart")
        self.engine.close()
        self._build()

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def integrity(self):
        if not hasattr(self, "engine"):
            return
        self._check_kv()
        for shadow in self.shadows.values():
            if shadow.sink.final is not None and shadow.rid not in self.checked:
                assert shadow.rid not in self.engine.runs
                check_oracle(self.backend, shadow)
                self.checked.add(shadow.rid)  # no event can follow the final one (Recorder)

    def _check_kv(self):
        """Engine and backend accounting (after a verification: the rejected drafts' KV is
        gone), and no slot reading KV of another key or adapter set."""
        self.engine.check_integrity()
        self.backend.check_integrity()
        self.ngram.check_integrity()
        n_slots = len(self.engine.pool.slots)
        for slot in self.engine.pool.slots:
            assert self.backend.seq_tokens(slot.seq_id) == slot.cached, "KV tokens drifted"
            run = slot.run
            pinned = None if run is None else run.request.options.slot_id
            assert pinned is None or slot.slot_id == pinned % n_slots, "a pinned run moved"
            if run is not None and run.resolved:
                tags = self.backend.seq_tags(slot.seq_id)
                assert tags <= {run.key}, f"slot {slot.slot_id} reads KV of {tags} as {run.key}"
                sets = self.backend.seq_adapter_sets(slot.seq_id)
                assert sets <= {run.adapter_set}, \
                    f"slot {slot.slot_id} reads KV computed under {sets} as {run.adapter_set}"
        assert self.engine.ram.total_bytes <= self.engine.ram.budget_bytes

    def _check_batches(self):
        for drafter in (self.oracle, self.ngram):
            for p in drafter.proposals:
                assert p.num_generated + p.n_max < self.shadows[p.request_id].max_tokens, \
                    f"asked for a draft past max_tokens: {p}"
            self.num_ngram_proposed += drafter is self.ngram and len(drafter.proposals)
            drafter.proposals.clear()
        check_plans(self.backend, self.engine.n_batch, self.engine.config.chunk_size)

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        drain(self.engine, max_ticks=5000, each=self._check_batches)
        self.integrity()
        for lease_id in list(self.engine.pool.leases):
            self.engine.release(lease_id)
        drain(self.engine, max_ticks=5000, each=self._check_batches)
        self.integrity()
        for shadow in self.shadows.values():
            final = shadow.sink.final
            assert final is not None, f"request {shadow.rid} never finished"
            if str(final.finish_reason) == "error":
                assert isinstance(final.exc, DecodeError | ContextOverflowError | LlamapyError)
                assert not isinstance(final.exc.__cause__, AssertionError), \
                    f"an assertion inside the tick failed request {shadow.rid}: {final.exc}"
        assert all(s.state is SlotState.IDLE for s in self.engine.pool.slots)
        assert not self.engine.runs and not self.engine.queue
        assert not self.backend.open_samplers, "a sampler was not closed"
        self._report()
        self.engine.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _report(self):
        """Label what this example exercised (shown by --hypothesis-show-statistics)."""
        report_events(self.engine.counters, self.backend.num_adapter_switches,
                      self.setup["spec"], self.num_ngram_proposed)


TestEngineMachine = EngineMachine.TestCase
