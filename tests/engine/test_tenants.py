"""Fair share between tenants: round-robin admission and the per-tenant request bound."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, submit

from llamapy.engine import BatchDecision, BatchView, DecodeMaximal, EngineConfig
from llamapy.engine.testing import drain
from llamapy.errors import InvalidOptionError, QueueFullError, TenantBusyError

P = list(range(1, 9))


def admissions(engine) -> list:
    """Request ids in the order they take a slot (wraps the pool's ``assign``)."""
    order: list = []
    assign = engine.pool.assign

    def record(run, slot):
        order.append(run.request_id)
        assign(run, slot)

    engine.pool.assign = record
    return order


def test_slots_go_round_robin_across_tenants_least_recently_served_first():
    engine, _ = make_engine(n_parallel=1, max_queue=0)
    order = admissions(engine)
    for i in range(5):
        submit(engine, f"a{i}", P, max_tokens=1, tenant="a")
    submit(engine, "b0", P, max_tokens=1, tenant="b")
    submit(engine, "b1", P, max_tokens=1, tenant="b")
    submit(engine, "c0", P, max_tokens=1)  # the default tenant is a tenant too
    drain(engine, each=engine.check_integrity)
    # a0 took the free slot at submission: "a" is the most recently served, b and c (never
    # served) go first, b before c (its queued run is older); then each goes behind the others
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2", "a3", "a4"]


def test_a_single_tenant_keeps_the_engine_order():
    for tenant in (None, "a"):
        engine, _ = make_engine(n_parallel=1, max_queue=0)
        order = admissions(engine)
        for i in range(4):
            submit(engine, i, P, max_tokens=1, tenant=tenant, session=i % 2)
        drain(engine)
        assert order == [0, 2, 1, 3]  # FIFO, the affine run (session 0's slot) first


class Lifo(DecodeMaximal):
    """Admits the newest queued run first."""

    name = "lifo"

    def admission_order(self, queue, now):
        return list(reversed(range(len(queue))))

    def allocate(self, view: BatchView) -> BatchDecision:
        return super().allocate(view)


def test_each_tenant_keeps_the_strategy_order_within_it():
    engine, _ = make_engine(n_parallel=1, max_queue=0, batch_strategy=Lifo())
    order = admissions(engine)
    submit(engine, "busy", P, max_tokens=1, tenant="z")
    for i in range(3):
        submit(engine, f"a{i}", P, max_tokens=1, tenant="a")
        submit(engine, f"b{i}", P, max_tokens=1, tenant="b")
    drain(engine)
    assert order == ["busy", "a2", "b2", "a1", "b1", "a0", "b0"]


def test_pinned_and_affine_runs_go_first_within_their_tenant_only():
    engine, _ = make_engine(n_parallel=2, max_queue=0)
    b_prompt = [p + 10 for p in P]  # (nothing in common with a's)
    submit(engine, "a", P, max_tokens=1, tenant="a", slot_id=0)  # slot 0: a's KV
    submit(engine, "b", b_prompt, max_tokens=1, tenant="b", slot_id=1)  # slot 1: b's
    drain(engine)
    order = admissions(engine)
    submit(engine, "a0", P, max_tokens=1, tenant="a", session="s", slot_id=0)
    submit(engine, "b0", b_prompt, max_tokens=1, tenant="b", slot_id=1)
    submit(engine, "a1", P, max_tokens=1, tenant="a")
    submit(engine, "b1", b_prompt, max_tokens=1, tenant="b")
    submit(engine, "a2", P, max_tokens=1, tenant="a", session="s")  # affine to slot 0
    submit(engine, "b2", b_prompt, max_tokens=1, tenant="b", slot_id=1)  # pinned, its own
    drain(engine)
    # a's turn first (served before b): its affine run before its older plain one; b's pinned
    # run comes before b1, but only at b's turn (after a2: a pin jumps no other tenant)
    assert order == ["a0", "b0", "a2", "b2", "a1", "b1"]


def test_a_flooding_tenant_delays_another_by_at_most_one_slot_per_tenant():
    engine, _ = make_engine(n_parallel=2, max_queue=0)
    order = admissions(engine)
    for i in range(30):
        submit(engine, f"a{i}", P, max_tokens=3, tenant="a")
    for _ in range(3):
        engine.tick()
    submit(engine, "b", P, max_tokens=1, tenant="b")
    queued_before = len(engine.queue) - 1
    start = len(order)
    while "b" not in order:
        engine.tick()
    # K = 1 other tenant: b takes one of the next K + 1 = 2 slots, not the 28th
    assert queued_before == 28
    assert order.index("b") - start <= 1
    drain(engine)


def test_a_tenant_over_its_bound_is_refused_and_others_are_not():
    engine, backend = make_engine(n_parallel=1, max_queue=0, tenant_max_requests=2)
    submit(engine, "a0", P, max_tokens=5, tenant="a")
    submit(engine, "a1", P, max_tokens=5, tenant="a")
    before = (len(engine.queue), sorted(engine.runs), len(backend.open_samplers))
    with pytest.raises(TenantBusyError) as info:
        submit(engine, "a2", P, max_tokens=5, tenant="a")
    err = info.value
    assert isinstance(err, QueueFullError) and err.http_status == 429
    assert (err.tenant, err.max_requests) == ("a", 2)
    assert "tenant_max_requests=2" in str(err) and "'a'" not in str(err)
    assert (len(engine.queue), sorted(engine.runs), len(backend.open_samplers)) == before
    assert engine.counters.num_rejected == 1
    submit(engine, "b0", P, max_tokens=1, tenant="b")
    submit(engine, "n0", P, max_tokens=1)
    submit(engine, "n1", P, max_tokens=1)
    with pytest.raises(TenantBusyError):  # the default tenant has the same bound
        submit(engine, "n2", P, max_tokens=1)
    engine.cancel("a1")
    submit(engine, "a2", P, max_tokens=5, tenant="a")  # queued + running counts, not history
    drain(engine, each=engine.check_integrity)
    assert engine.tenants.active() == {}


def test_the_request_bound_counts_running_requests_too():
    engine, _ = make_engine(n_parallel=2, tenant_max_requests=2)
    submit(engine, 0, P, max_tokens=5, tenant="a")
    submit(engine, 1, P, max_tokens=5, tenant="a")
    assert not engine.queue
    with pytest.raises(TenantBusyError):
        submit(engine, 2, P, max_tokens=5, tenant="a")
    assert engine.tenants.active() == {"a": 2}


@pytest.mark.parametrize(("name", "value"), [
    ("tenant_max_requests", -1), ("tenant_max_requests", 1.5), ("tenant_cache_share", 0),
    ("tenant_cache_share", 1.5), ("tenant_cache_share", float("nan"))])
def test_tenant_options_are_validated(name, value):
    with pytest.raises(InvalidOptionError) as info:
        EngineConfig(**{name: value})
    assert info.value.option == name


def test_tenant_max_slots_keeps_a_slot_free_for_another_tenant():
    engine, _ = make_engine(n_parallel=3, max_queue=0, tenant_max_slots=2)
    for i in range(5):
        submit(engine, f"a{i}", P, max_tokens=4, tenant="a")
    engine.tick()
    held = [slot.run.request_id for slot in engine.pool.slots if slot.run is not None]
    assert sorted(held) == ["a0", "a1"]  # the third slot stays idle although a's runs wait
    submit(engine, "b0", P, max_tokens=4, tenant="b")
    engine.tick()
    b0 = engine.runs["b0"]
    assert b0.slot is not None  # b's request took the idle slot at the next tick
    drain(engine, each=engine.check_integrity)


def test_tenant_max_slots_holds_while_a_flood_drains():
    engine, _ = make_engine(n_parallel=2, max_queue=0, tenant_max_slots=1)
    for i in range(4):
        submit(engine, f"a{i}", P, max_tokens=2, tenant="a")
    for i in range(2):
        submit(engine, f"b{i}", P, max_tokens=2, tenant="b")

    def one_each() -> None:
        engine.check_integrity()  # (raises if a tenant holds more than one slot)
        tenants = [s.run.request.options.tenant for s in engine.pool.slots if s.run]
        assert len(tenants) == len(set(tenants))

    drain(engine, each=one_each)
    assert not engine.runs


def test_tenant_max_slots_is_checked():
    with pytest.raises(InvalidOptionError, match="tenant_max_slots"):
        EngineConfig(tenant_max_slots=-1)
