"""Stateful property test of tenants on the fake backend.

Rules submit requests of random tenants (the default one among them), sub-scopes, cache salts,
sessions and pinned slots over a tiny token alphabet (prefixes collide across tenants), submit
bursts of one tenant, cancel and tick, with a RAM and a disk prompt cache held to a per-tenant
share and a per-tenant bound on requests. Checked after every step (and at every slot handed
out):

- no reuse crosses a tenant or a salt: every slot reads only KV written under its run's own
  cache key (tenant, scope, salt digest, ...), by the fake backend's KV provenance, and every
  finished request's tokens are the reference output for its prompt;
- fair share: a slot handed to tenant ``X`` while tenant ``B`` waits (``B`` has a queued run any
  idle slot can take) goes to an ``X`` served less recently than ``B`` (never served, with an
  older queued run, when ``B`` never was either), and no tenant takes two slots while ``B``
  waits: so ``B`` takes one of the next ``K + 1`` slots handed out, ``K`` the other tenants
  (:mod:`llamapy.engine.tenants`), while another tenant floods;
- every tenant's RAM and disk cache bytes stay within its share of each budget;
- no tenant's runs hold more than ``tenant_max_slots`` slots (a tenant at that cap does not
  count as waiting above);
- ``TenantBusyError`` exactly when the request's tenant holds ``tenant_max_requests`` queued or
  running requests, ``QueueFullError`` exactly when the queue is full;
- a ``slot_id`` naming a slot that holds another tenant's request or KV is refused
  (``PermissionDeniedError``) exactly then, and a pinned run never takes such a slot (one whose
  slot changes hands while it waits ends with that error).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
)

from llamapy.engine import (
    BatchDecision,
    BatchView,
    DecodeMaximal,
    EngineConfig,
    EngineTuning,
    Request,
    RequestOptions,
    SamplingParams,
)
from llamapy.engine.cache.disk import CacheNamespace
from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.states import SlotState
from llamapy.engine.testing import Recorder, drain
from llamapy.errors import (
    ContextOverflowError,
    PermissionDeniedError,
    QueueFullError,
    TenantBusyError,
)

TENANTS = ("a", "b", "c", None)
SCOPES = (None, None, "x")
SALTS = (None, None, "s1", "s2")
PREFIXES: tuple[list[int], ...] = (
    [], [1, 2, 3, 1, 2, 3, 1, 2], [1, 2, 3, 3, 2, 1, 1, 2, 3, 3, 2, 1], [2, 2, 1, 1, 2])
NEVER = 0


class ShortestPromptFirst(DecodeMaximal):
    """A strategy with an admission order of its own (kept within each tenant)."""

    name = "shortest_prompt_first"

    def admission_order(self, queue, now):
        return sorted(range(len(queue)), key=lambda i: (queue[i].prompt_tokens, i))

    def allocate(self, view: BatchView) -> BatchDecision:
        return super().allocate(view)


@st.composite
def setups(draw: st.DrawFn) -> dict:
    return dict(
        n_parallel=draw(st.integers(1, 3)), per_seq=draw(st.sampled_from([32, 64])),
        unified=draw(st.booleans()),
        n_batch=draw(st.integers(4, 32)), chunk_size=draw(st.integers(2, 16)),
        max_queue=draw(st.sampled_from([0, 0, 3, 8])),
        tenant_max=draw(st.sampled_from([0, 1, 2, 4])),
        slot_cap=draw(st.sampled_from([0, 0, 1, 2])),
        share=draw(st.sampled_from([1.0, 0.5, 0.34])),
        ram_mb=draw(st.sampled_from([0, 0.002, 0.006])),
        disk_mb=draw(st.sampled_from([0, 0, 0.003, 0.01])),
        strategy=draw(st.sampled_from(["decode_maximal", "balanced", "spf"])),
    )


def tenant_of(run) -> str | None:
    return run.request.options.tenant


def waits(run) -> bool:
    """Whether a queued run can take any idle slot (no lease, no pinned slot)."""
    return run.request.lease_id is None and run.request.options.slot_id is None


class TenantMachine(RuleBasedStateMachine):
    """See the module docstring."""

    requests = Bundle("requests")

    @initialize(setup=setups())
    def start(self, setup: dict) -> None:
        self.setup = setup
        self.folder = tempfile.mkdtemp(prefix="llamapy-tenants-") if setup["disk_mb"] else None
        unified, n_slots = setup["unified"], setup["n_parallel"]
        self.backend = FakeBackend(
            n_ctx=setup["per_seq"] * (1 if unified else n_slots), n_seq_max=n_slots,
            kv_unified=unified, n_batch=64, state_bytes_per_token=32)
        config = EngineConfig(
            n_parallel=n_slots, kv_unified=unified, n_batch=setup["n_batch"],
            chunk_size=setup["chunk_size"], max_queue=setup["max_queue"],
            tenant_max_requests=setup["tenant_max"], tenant_cache_share=setup["share"],
            tenant_max_slots=setup["slot_cap"],
            prompt_cache_ram_mb=setup["ram_mb"], prompt_cache_dir=self.folder,
            prompt_cache_disk_mb=setup["disk_mb"],
            batch_strategy=ShortestPromptFirst() if setup["strategy"] == "spf"
            else setup["strategy"])
        tuning = EngineTuning(ram_min_tokens=4, disk_min_tokens=4, follow_min_tokens=2,
                              disk_background=False)
        self.engine = Engine(self.backend, config, tuning=tuning, clock=self.backend.clock.now,
                             cache_namespace=CacheNamespace("fake"))
        self.sinks: dict[int, tuple[list[int], int, SamplingParams, Recorder]] = {}
        self.next_id = 0
        self.grants = 0
        self.last_grant: dict[str | None, int] = {}
        #: For each waiting tenant: the other tenants given a slot since it began to wait or
        #: was last given one.
        self.passed: dict[str | None, set[str | None]] = {}
        self.num_busy = 0
        self.num_denied = 0
        #: Requests pinned by ``slot_id`` (one whose slot changes hands while it waits ends
        #: with PermissionDeniedError).
        self.pinned: set[int] = set()
        self.unfair: list[str] = []
        self.num_contended = 0
        assign = self.engine.pool.assign
        self.engine.pool.assign = lambda run, slot: (self._granted(run, slot), assign(run, slot))

    # --- rules ---------------------------------------------------------------------------------

    @rule(target=requests, tenant=st.sampled_from(TENANTS), scope=st.sampled_from(SCOPES),
          salt=st.sampled_from(SALTS), session=st.sampled_from([None, None, 1, 2]),
          prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(1, 3), max_size=8),
          max_tokens=st.integers(0, 5), slot_id=st.sampled_from([None] * 5 + [0, 1]))
    def submit(self, tenant, scope, salt, session, prefix, tail, max_tokens, slot_id):
        return multiple(*self._submit(tenant, scope, salt, session, prefix + tail or [1],
                                      max_tokens, slot_id))

    @rule(target=requests, tenant=st.sampled_from(TENANTS), n=st.integers(2, 8),
          prefix=st.sampled_from(PREFIXES[1:]), tails=st.lists(st.integers(1, 3), min_size=8,
                                                               max_size=8),
          max_tokens=st.integers(1, 6))
    def burst(self, tenant, n, prefix, tails, max_tokens):
        """One tenant floods: ``n`` requests at once sharing a prefix."""
        ids = []
        for i in range(n):
            ids += self._submit(tenant, None, None, None, prefix + tails[: i + 1], max_tokens,
                                None)
        return multiple(*ids)

    def _submit(self, tenant, scope, salt, session, prompt, max_tokens, slot_id) -> list[int]:
        rid, self.next_id = self.next_id, self.next_id + 1
        params = SamplingParams(seed=rid % 3, temp=0.0 if rid % 2 else 0.8)
        options = RequestOptions(max_tokens=max_tokens, tenant=tenant, cache_scope=scope,
                                 cache_salt=salt, session=session, slot_id=slot_id,
                                 sampling=params)
        engine, sink = self.engine, Recorder()
        overflow = len(prompt) + max_tokens > self.backend.n_ctx_seq
        held = Counter(tenant_of(r) for r in engine.runs.values())[tenant]
        busy = 0 < engine.config.tenant_max_requests <= held
        full = 0 < engine.config.max_queue <= len(engine.queue)
        slots = engine.pool.slots
        denied = slot_id is not None and slots[slot_id % len(slots)].held_by_other(tenant)
        try:
            engine.submit(Request(rid, prompt, options, sink))
        except ContextOverflowError:
            assert overflow
            return []
        except TenantBusyError as exc:
            assert busy and not overflow, f"TenantBusyError for {tenant!r} holding {held}"
            assert exc.tenant == tenant
            self.num_busy += 1
            return []
        except PermissionDeniedError:
            assert denied and not busy and not overflow, "a pin refused on a slot it may use"
            self.num_denied += 1
            return []
        except QueueFullError:
            assert full and not busy and not overflow and not denied, \
                "QueueFullError with room in the queue"
            return []
        assert not (overflow or busy or full or denied), "accepted although it had to be refused"
        self.sinks[rid] = (prompt, max_tokens, params, sink)
        if slot_id is not None:
            self.pinned.add(rid)
        self._sync_waiting()
        return [rid]

    @rule(rid=requests)
    def cancel(self, rid):
        self.engine.cancel(rid)
        self._sync_waiting()

    @rule(n=st.integers(1, 6))
    def tick(self, n):
        for _ in range(n):
            self.engine.tick()
            self._sync_waiting()

    # --- fair share ----------------------------------------------------------------------------

    def _waiting(self) -> dict[str | None, int]:
        """Waiting tenants (not at their slot cap) and the serial of their oldest queued run."""
        out: dict[str | None, int] = {}
        for run in self.engine.queue:
            if waits(run) and not self.engine.admission.capped(run):
                out.setdefault(tenant_of(run), run.serial)
        return out

    def _sync_waiting(self) -> None:
        waiting = self._waiting()
        self.passed = {t: self.passed.get(t, set()) for t in waiting}

    def _granted(self, run, slot) -> None:
        """Called as ``run`` takes ``slot`` (already out of the queue), on the tick: what it
        finds wrong goes to :attr:`unfair` (an assertion here would only fail the run)."""
        if run.request.options.slot_id is not None and slot.held_by_other(tenant_of(run)):
            self.unfair.append(f"a run pinned by slot_id took slot {slot.slot_id} of another "
                               "tenant")
        if slot.lease_id is not None:
            return
        tenant = tenant_of(run)
        oldest = min([run.serial] + [r.serial for r in self.engine.queue
                                     if tenant_of(r) == tenant])
        mine = self.last_grant.get(tenant, NEVER)
        for other, since in self._waiting().items():
            if other == tenant:
                continue
            theirs = self.last_grant.get(other, NEVER)
            if not (mine < theirs or (mine == theirs == NEVER and oldest < since)):
                self.unfair.append(f"{tenant!r} (last served {mine}) passed waiting "
                                   f"{other!r} (last served {theirs})")
            passed = self.passed.setdefault(other, set())
            if tenant in passed:
                self.unfair.append(f"{tenant!r} took two slots while {other!r} waited")
            passed.add(tenant)
            self.num_contended += 1
        self.grants += 1
        self.last_grant[tenant] = self.grants
        self.passed[tenant] = set()

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def integrity(self):
        if not hasattr(self, "engine"):
            return
        engine = self.engine
        assert not self.unfair, self.unfair
        engine.check_integrity()  # tenant counts and bound; cache budgets, per tenant too
        self.backend.check_integrity()  # no segment attended to KV of another cache key
        for slot in engine.pool.slots:
            run = slot.run
            if run is not None and run.resolved:
                tags = self.backend.seq_tags(slot.seq_id)
                assert tags <= {run.key}, f"slot {slot.slot_id} reads KV of {tags} as {run.key}"
        for cache in (engine.ram, engine.disk):
            assert all(n <= cache.tenant_budget for n in cache.tenant_bytes().values())
        for rid, (prompt, max_tokens, params, sink) in list(self.sinks.items()):
            if sink.final is not None:
                exc = sink.final.exc if sink.finish_reason == "error" else None
                if exc is not None and not (rid in self.pinned  # its slot changed hands
                                            and isinstance(exc, PermissionDeniedError)):
                    # only the KV cells shared by all slots running out
                    assert self.setup["unified"] and isinstance(exc, ContextOverflowError), \
                        f"request {rid}: {exc!r}"
                expected = self.backend.model.reference(prompt, max_tokens, params, ())
                assert sink.tokens == expected[: len(sink.tokens)], f"request {rid} diverged"
                if sink.finish_reason in ("eog", "max_tokens"):
                    assert sink.tokens == expected
                del self.sinks[rid]

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        drain(self.engine, max_ticks=5000, each=self._sync_waiting)
        self.integrity()
        assert not self.sinks, "a request never finished"
        assert all(s.state is SlotState.IDLE for s in self.engine.pool.slots)
        assert self.engine.tenants.active() == {}
        counters = self.engine.counters
        for name in ("num_reused_own", "num_reused_donor", "num_reused_ram", "num_reused_disk"):
            if counters.flat()[name]:
                event(name)
        if self.num_busy:
            event("TenantBusyError")
        if self.num_denied:
            event("slot_id on another tenant's slot refused")
        if len(self.last_grant) > 1:
            event("several tenants served")
        if self.num_contended:
            event("a slot handed out while another tenant waited")
        for name, cache in (("ram", self.engine.ram), ("disk", self.engine.disk)):
            if cache.num_evictions and self.setup["share"] < 1:
                event(f"{name} evictions under a tenant share")
        self.engine.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


TestTenantMachine = TenantMachine.TestCase
TestTenantMachine.settings = settings(
    TestTenantMachine.settings, max_examples=min(TestTenantMachine.settings.max_examples, 150),
    stateful_step_count=min(TestTenantMachine.settings.stateful_step_count, 50))
