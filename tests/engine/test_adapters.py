"""Adapter sets: one set per decode call, fair rotation between sets, reuse never crosses sets,
and the fake backend's checks that make any violation visible."""

from __future__ import annotations

import itertools

import pytest
from engine_helpers import make_engine, ref, submit

from llamapy.engine import BatchPlan, EngineTuning, FakeBackend, Segment
from llamapy.engine.planner import AdapterRotation
from llamapy.engine.testing import drain
from llamapy.errors import InvalidOptionError

A = (("a.gguf", 1.0),)
B = (("b.gguf", 0.5),)
SYSTEM = list(range(1, 41))


def run_all(engine):
    drain(engine, each=lambda: (engine.check_integrity(), engine.backend.check_integrity()))


def plan_sets(backend: FakeBackend) -> list:
    """The adapter set of each recorded plan; asserts every segment belongs to it."""
    for plan in backend.plans:
        assert all(seg.tag[2] == plan.adapter_set for seg in plan.segments)
    return [plan.adapter_set for plan in backend.plans]


def test_adapter_set_changes_the_output_and_matches_its_reference():
    engine, backend = make_engine(n_parallel=3)
    sinks = {s: submit(engine, str(s), SYSTEM, max_tokens=8, temp=0.0, adapters=s)
             for s in ((), A, B)}
    run_all(engine)
    outputs = {s: sink.tokens for s, sink in sinks.items()}
    for s, tokens in outputs.items():
        assert tokens == ref(backend, SYSTEM, 8, adapters=s, temp=0.0)
    assert len({tuple(t) for t in outputs.values()}) == 3


def test_each_plan_runs_one_set_and_decoding_sets_alternate():
    engine, backend = make_engine(n_parallel=4, n_ctx=2048)
    for i, s in enumerate(((), (), A, A)):
        submit(engine, i, [*SYSTEM, i + 1], max_tokens=6, adapters=s, logit_bias={0: -1e9})
    run_all(engine)
    sets = plan_sets(backend)
    assert set(sets) == {(), A}
    assert all(a != b for a, b in itertools.pairwise(sets))  # strict alternation
    assert backend.num_adapter_switches == len(sets) - 1
    assert engine.stats().counters.num_adapter_switches == backend.num_adapter_switches


def test_no_set_starves_and_ties_go_to_the_oldest_run():
    engine, backend = make_engine(n_parallel=3, n_ctx=2048)
    for i, s in enumerate((B, (), A)):
        submit(engine, i, [*SYSTEM, i + 1], max_tokens=5, adapters=s, logit_bias={0: -1e9})
    run_all(engine)
    # never-served sets go in submission order, then strict rotation: each set every 3 ticks
    assert plan_sets(backend) == [B, (), A] * 5


def test_rotation_serves_least_recently_served_first():
    engine, _ = make_engine(n_parallel=2)
    submit(engine, "old", SYSTEM, max_tokens=1, adapters=A)
    submit(engine, "new", SYSTEM, max_tokens=1, adapters=B)
    rotation = AdapterRotation()
    slots = [s for s in engine.pool.slots if s.run is not None]
    picks = [rotation.choose(slots) for _ in range(4)]
    assert picks == [A, B, A, B]
    assert rotation.choose(slots[1:]) == B  # a single set is always served


def test_reuse_never_crosses_adapter_sets_own_slot():
    engine, backend = make_engine(n_parallel=1)
    submit(engine, 1, SYSTEM, max_tokens=2)
    run_all(engine)
    under_a = submit(engine, 2, SYSTEM, max_tokens=2, adapters=A)
    run_all(engine)
    again = submit(engine, 3, SYSTEM, max_tokens=2, adapters=A)
    run_all(engine)
    assert under_a.final.timings.reused_tokens == 0
    assert again.final.timings.reused_tokens == len(SYSTEM) - 1
    assert again.tokens == under_a.tokens == ref(backend, SYSTEM, 2, adapters=A)


def test_no_donor_and_no_in_flight_sharing_across_sets():
    engine, backend = make_engine(n_parallel=2, n_ctx=2048, chunk_size=16,
                                  tuning=EngineTuning(follow_min_tokens=2))
    base = submit(engine, "base", [*SYSTEM, 1], max_tokens=3)
    lora = submit(engine, "lora", [*SYSTEM, 2], max_tokens=3, adapters=A)
    run_all(engine)
    assert engine.counters.reused["donor"] == engine.counters.reused["inflight"] == 0
    assert engine.counters.num_prefill_tokens == 2 * (len(SYSTEM) + 1)
    assert base.tokens == ref(backend, [*SYSTEM, 1], 3)
    assert lora.tokens == ref(backend, [*SYSTEM, 2], 3, adapters=A)
    late = submit(engine, "late", [*SYSTEM, 3], max_tokens=1, adapters=A)
    run_all(engine)
    assert late.final.timings.reused_tokens == len(SYSTEM)  # same set: reuse as usual


def test_ram_cache_never_serves_another_set():
    engine, backend = make_engine(n_parallel=1, prompt_cache_ram_mb=1, n_ctx=512,
                                  tuning=EngineTuning(ram_min_tokens=8))
    long_a = [*SYSTEM, *range(41, 61)]
    submit(engine, "a1", long_a, max_tokens=2, adapters=A)
    run_all(engine)
    submit(engine, "b1", list(range(61, 121)), max_tokens=2)  # A's prefix goes to RAM
    run_all(engine)
    assert len(engine.ram) == 1
    other = submit(engine, "a2", [*long_a, 5], max_tokens=2, adapters=B)
    run_all(engine)
    assert other.final.timings.reused_tokens == 0
    same = submit(engine, "a3", [*long_a, 5], max_tokens=2, adapters=A)
    run_all(engine)
    assert same.final.timings.reuse_source in ("ram", "own")
    assert same.tokens == ref(backend, [*long_a, 5], 2, adapters=A)


def test_lease_carries_its_adapter_set():
    engine, backend = make_engine(n_parallel=2)
    lease = engine.lease("s", "ident", A)
    first = submit(engine, 1, SYSTEM, max_tokens=0, cache_scope="s", identity="ident",
                   adapters=A, lease_id=lease)
    run_all(engine)
    again = submit(engine, 2, [*SYSTEM, 5], max_tokens=2, cache_scope="s", identity="ident",
                   adapters=A, lease_id=lease)
    run_all(engine)
    assert first.finish_reason == "prefill"
    assert again.final.timings.reused_tokens == len(SYSTEM)
    assert again.tokens == ref(backend, [*SYSTEM, 5], 2, adapters=A)
    state = engine.leases.save(lease)
    assert engine.leases.restore(lease, state, cache_identity="new")
    assert engine.pool.leased_slot(lease).key == ("s", "new", A, None, None)
    assert engine.leases.tokens(lease) == list(state.token_ids)
    other = submit(engine, 3, SYSTEM, max_tokens=1, cache_scope="s", identity="new",
                   lease_id=lease)  # base model on a lease filed under A: nothing reused
    run_all(engine)
    assert other.final.timings.reused_tokens == 0
    assert other.tokens == ref(backend, SYSTEM, 1)


def test_adapters_option_is_an_opaque_hashable_tuple():
    engine, _ = make_engine(n_parallel=1)
    sink = submit(engine, 1, SYSTEM, max_tokens=1, adapters=[("a.gguf", 1.0)])
    assert engine.runs[1].request.adapter_set == A
    run_all(engine)
    assert sink.finish_reason in ("eog", "max_tokens")
    with pytest.raises(InvalidOptionError):
        submit(engine, 2, SYSTEM, adapters=[{"path": "a.gguf"}])


def test_fake_backend_records_reads_across_adapter_sets():
    backend = FakeBackend(n_ctx=16, n_seq_max=1, record_plans=True)
    backend.decode(BatchPlan([Segment(0, 0, [1, 2], True)], A))
    assert backend.seq_adapter_sets(0) == {A} and backend.num_adapter_switches == 1
    backend.decode(BatchPlan([Segment(0, 2, [3], True)], A))
    backend.check_integrity()
    backend.decode(BatchPlan([Segment(0, 3, [4], True)], B))
    assert backend.adapter_set == B and backend.num_adapter_switches == 2
    with pytest.raises(AssertionError, match="computed under"):
        backend.check_integrity()


def test_fake_state_round_trip_keeps_adapter_sets():
    backend = FakeBackend(n_ctx=16, n_seq_max=2)
    backend.decode(BatchPlan([Segment(0, 0, [1, 2, 3], True, tag=("s", "", A))], A))
    assert backend.state_seq_set(1, backend.state_seq_get(0))
    assert backend.seq_adapter_sets(1) == {A} and backend.seq_tags(1) == {("s", "", A)}
    backend.check_integrity()
