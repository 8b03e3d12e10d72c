"""Prefix reuse: own slot, donor slot, RAM cache, in-flight dedup, scope isolation."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, ref, submit

from llamapy.engine import EngineTuning
from llamapy.engine.testing import drain

SYSTEM = list(range(1, 41))  # a 40-token shared prefix


def run_all(engine):
    drain(engine, each=lambda: (engine.check_integrity(), engine.backend.check_integrity()))


def test_identical_prompt_reuses_all_but_the_last_token():
    engine, backend = make_engine(n_parallel=1)
    submit(engine, 1, SYSTEM, max_tokens=3, seed=4)
    run_all(engine)
    sink = submit(engine, 2, SYSTEM, max_tokens=3, seed=4)
    run_all(engine)
    assert sink.final.timings.reused_tokens == len(SYSTEM) - 1
    assert sink.final.timings.reuse_source == "own"
    assert sink.final.timings.prefill_tokens == 1
    assert sink.tokens == ref(backend, SYSTEM, 3, seed=4)


def test_extension_reuses_the_cached_conversation():
    engine, backend = make_engine(n_parallel=1)
    first = submit(engine, 1, SYSTEM, max_tokens=4, temp=0.0)
    run_all(engine)
    turn2 = SYSTEM + first.tokens[:-1] + [7, 8, 9]
    sink = submit(engine, 2, turn2, max_tokens=4, temp=0.0)
    run_all(engine)
    assert sink.final.timings.reused_tokens == len(SYSTEM) + len(first.tokens) - 1
    assert sink.tokens == ref(backend, turn2, 4, temp=0.0)


def test_cache_prompt_false_neither_reuses_nor_retains():
    engine, _ = make_engine(n_parallel=1)
    submit(engine, 1, SYSTEM, max_tokens=2)
    run_all(engine)
    sink = submit(engine, 2, SYSTEM, max_tokens=2, cache_prompt=False)
    run_all(engine)
    assert sink.final.timings.reused_tokens == 0
    assert engine.pool.slots[0].cached == []
    engine2, _ = make_engine(n_parallel=1, cache_prompt=False)
    sink = submit(engine2, 1, SYSTEM, max_tokens=2)
    run_all(engine2)
    assert engine2.pool.slots[0].cached == []


def test_donor_copy_is_metadata_only():
    engine, backend = make_engine(n_parallel=2, batch_strategy="decode_maximal")  # (one tick)
    submit(engine, "warm", [*SYSTEM, 100], max_tokens=1)
    run_all(engine)
    submit(engine, "busy", [*SYSTEM, 100, 5], max_tokens=30, session="s")
    submit(engine, "new", [*SYSTEM, 300], max_tokens=30)
    engine.tick()
    assert engine.runs["new"].slot.cached[:40] == SYSTEM
    # 40 shared cells + 100 (warm) + 5 (busy) + 300 (new); copying would need 40 more
    assert backend.num_cells_used == 43


def test_donor_used_when_the_routed_slot_is_busy_elsewhere():
    engine, backend = make_engine(n_parallel=2)
    submit(engine, "warm", [*SYSTEM, 100], max_tokens=1)
    run_all(engine)
    warm_slot = next(s for s in engine.pool.slots if s.cached)
    submit(engine, "busy", [*SYSTEM, 100, 5], max_tokens=30, session="s")  # takes warm slot
    assert engine.runs["busy"].slot is warm_slot
    sink = submit(engine, "new", [*SYSTEM, 300], max_tokens=2)
    run_all(engine)
    assert sink.final.timings.reuse_source == "donor"
    assert sink.final.timings.reused_tokens == len(SYSTEM)
    assert engine.counters.reused["donor"] == len(SYSTEM)
    assert sink.tokens == ref(backend, [*SYSTEM, 300], 2)


def test_no_donor_reuse_with_split_kv():
    engine, backend = make_engine(n_parallel=2, unified=False, n_ctx=256)
    submit(engine, "warm", [*SYSTEM, 100], max_tokens=1)
    run_all(engine)
    submit(engine, "busy", [*SYSTEM, 100, 5], max_tokens=30)
    sink = submit(engine, "new", [*SYSTEM, 300], max_tokens=2)
    run_all(engine)
    assert engine.counters.reused["donor"] == 0
    assert sink.final.timings.reused_tokens == 0
    assert sink.tokens == ref(backend, [*SYSTEM, 300], 2)


def test_scope_and_identity_isolate_reuse():
    engine, _ = make_engine(n_parallel=3)
    submit(engine, 1, SYSTEM, max_tokens=1, cache_scope="tenant-a")
    run_all(engine)
    other_scope = submit(engine, 2, SYSTEM, max_tokens=1, cache_scope="tenant-b")
    run_all(engine)
    other_identity = submit(engine, 3, SYSTEM, max_tokens=1, cache_scope="tenant-a",
                            identity="lora-x")
    run_all(engine)
    same = submit(engine, 4, SYSTEM, max_tokens=1, cache_scope="tenant-a")
    run_all(engine)
    assert other_scope.final.timings.reused_tokens == 0
    assert other_identity.final.timings.reused_tokens == 0
    assert same.final.timings.reused_tokens == len(SYSTEM) - 1


def test_recurrent_backends_reuse_exact_prefixes_only():
    engine, backend = make_engine(n_parallel=1, partial=False)
    submit(engine, 1, SYSTEM[:20], max_tokens=1, temp=0.0)
    run_all(engine)
    diverging = submit(engine, 2, [*SYSTEM[:10], 99, 98], max_tokens=1, temp=0.0)
    run_all(engine)
    assert diverging.final.timings.reused_tokens == 0  # would need a partial removal
    cached = list(engine.pool.slots[0].cached)
    assert cached == [*SYSTEM[:10], 99, 98]
    same = submit(engine, 3, cached, max_tokens=1, temp=0.0)
    run_all(engine)
    assert same.final.timings.reused_tokens == 0  # the last token cannot be removed alone
    extending = submit(engine, 4, [*cached, 5, 6], max_tokens=1, temp=0.0)
    run_all(engine)
    assert extending.final.timings.reused_tokens == len(cached)
    assert extending.tokens == ref(backend, [*cached, 5, 6], 1, temp=0.0)


def ram_engine(**kw):
    return make_engine(n_parallel=1, prompt_cache_ram_mb=1, n_ctx=512,
                       tuning=EngineTuning(ram_min_tokens=8), **kw)


def test_ram_cache_restores_an_evicted_prefix():
    engine, backend = ram_engine()
    long_a = [*SYSTEM, *range(41, 61)]
    long_b = list(range(61, 121))
    submit(engine, "a1", long_a, max_tokens=2)
    run_all(engine)
    submit(engine, "b1", long_b, max_tokens=2)  # destroys A's prefix: offered to RAM
    run_all(engine)
    assert len(engine.ram) == 1
    sink = submit(engine, "a2", [*long_a, 5], max_tokens=2)
    run_all(engine)
    assert sink.final.timings.reuse_source == "ram"
    assert sink.final.timings.reused_tokens == len(long_a)
    assert engine.counters.restores["ram"] == 1
    assert backend.num_state_gets == engine.ram.num_stored == 2  # A, then B: each when stored
    assert sink.tokens == ref(backend, [*long_a, 5], 2)


def test_a_history_is_kept_when_a_chat_sharing_only_its_system_prompt_takes_the_slot():
    # B keeps 40 of A's 52 cached tokens (more than half) yet A's own 12-token turn goes
    engine, backend = ram_engine()
    chat_a = [*SYSTEM, *range(41, 51)]
    submit(engine, "a1", chat_a, max_tokens=2)
    run_all(engine)
    submit(engine, "b1", [*SYSTEM, *range(61, 71)], max_tokens=2)
    run_all(engine)
    follow_up = [*chat_a, *range(81, 86)]
    sink = submit(engine, "a2", follow_up, max_tokens=2)
    run_all(engine)
    assert sink.final.timings.reuse_source == "ram"
    assert sink.final.timings.reused_tokens == len(chat_a)
    assert sink.tokens == ref(backend, follow_up, 2)


def test_a_short_tail_dropped_from_its_own_slot_is_not_stored():
    engine, _ = ram_engine()
    submit(engine, "a1", [*SYSTEM, *range(41, 51)], max_tokens=2)
    run_all(engine)
    submit(engine, "a2", [*SYSTEM, *range(41, 46), 99], max_tokens=2)  # a 7-token tail goes
    run_all(engine)
    assert engine.ram.num_stored == 0


@pytest.mark.parametrize(("budget_mb", "stores"), [(0.002, False), (1, True)])
def test_only_stored_prefixes_are_serialised(budget_mb, stores):
    # 0.002 MiB = 2097 bytes; a 40-token prefix costs 40 * (64 + 4) = 2720 bytes
    engine, backend = make_engine(n_parallel=2, prompt_cache_ram_mb=budget_mb, n_ctx=512,
                                  tuning=EngineTuning(ram_min_tokens=8))
    sinks = []
    for i in range(6):  # two slots, six distinct prompts: every slot's prefix is destroyed
        prompt = [1 + (7 * i + j) % 200 for j in range(40)]
        sinks.append((prompt, submit(engine, i, prompt, max_tokens=2)))
        run_all(engine)
    assert engine.ram.enabled and backend.num_state_gets == engine.ram.num_stored
    assert (engine.ram.num_stored >= 4) if stores else (engine.ram.num_stored == 0)
    for prompt, sink in sinks:
        assert sink.tokens == ref(backend, prompt, 2)


def test_failed_restore_falls_back_to_prefill():
    engine, backend = ram_engine()
    long_a = [*SYSTEM, *range(41, 61)]
    submit(engine, "a1", long_a, max_tokens=2)
    run_all(engine)
    submit(engine, "b1", list(range(61, 121)), max_tokens=2)
    run_all(engine)
    backend.inject("restore_fail")
    sink = submit(engine, "a2", [*long_a, 5], max_tokens=2)
    run_all(engine)
    assert engine.counters.restore_failures["ram"] == 1
    assert sink.final.timings.reused_tokens == 0
    assert sink.tokens == ref(backend, [*long_a, 5], 2)


def test_ram_cache_never_serves_another_scope():
    engine, _ = ram_engine()
    long_a = [*SYSTEM, *range(41, 61)]
    submit(engine, "a1", long_a, max_tokens=2, cache_scope="t1")
    run_all(engine)
    submit(engine, "b1", list(range(61, 121)), max_tokens=2, cache_scope="t1")
    run_all(engine)
    sink = submit(engine, "a2", [*long_a, 5], max_tokens=2, cache_scope="t2")
    run_all(engine)
    assert sink.final.timings.reused_tokens == 0


def wave(dedup: bool, n: int = 8, shared: int = 494, suffix: int = 12):
    engine, backend = make_engine(n_parallel=n, n_ctx=8192, chunk_size=512, n_batch=2048,
                                  tuning=EngineTuning(inflight_dedup=dedup))
    prefix = [1 + (i * 7) % 60 for i in range(shared)]
    prompts = {i: [*prefix, *[1 + (i + j) % 60 for j in range(suffix)]] for i in range(n)}
    sinks = {i: submit(engine, i, p, max_tokens=4, seed=i) for i, p in prompts.items()}
    run_all(engine)
    for i, p in prompts.items():
        assert sinks[i].tokens == ref(backend, p, 4, seed=i)
    return engine.counters


def test_in_flight_dedup_computes_a_shared_prefix_once():
    without, with_dedup = wave(False), wave(True)
    assert without.num_prefill_tokens == 8 * (494 + 12)
    assert with_dedup.num_prefill_tokens == 494 + 8 * 12
    assert with_dedup.reused["inflight"] == 7 * 494


def test_in_flight_dedup_follows_chunk_by_chunk():
    engine, backend = make_engine(n_parallel=2, n_ctx=2048, chunk_size=64, n_batch=128,
                                  tuning=EngineTuning(follow_min_tokens=8))
    prefix = [1 + (i * 5) % 50 for i in range(300)]
    a = submit(engine, "a", [*prefix, 1], max_tokens=2)
    b = submit(engine, "b", [*prefix, 2], max_tokens=2)
    run_all(engine)
    assert engine.counters.num_prefill_tokens == 300 + 2
    assert b.final.timings.inflight_tokens == 300
    assert a.tokens == ref(backend, [*prefix, 1], 2) and b.tokens == ref(backend, [*prefix, 2], 2)


def test_prefix_instability_is_flagged():
    engine, _ = make_engine(n_parallel=1, n_ctx=4096,
                            tuning=EngineTuning(instability_min_history=100))
    history = list(range(1, 61)) * 4  # 240 tokens
    submit(engine, 1, history, max_tokens=1)
    run_all(engine)
    rewritten = [*history[:60], *[7] * 100]  # matches 25% of the cached history
    submit(engine, 2, rewritten, max_tokens=1)
    run_all(engine)
    events = engine.stats().instability_events
    assert engine.counters.num_instability_events == 1
    assert events[0].request_id == 2 and events[0].matched_tokens == 60
    assert 0.1 <= events[0].matched_share < 0.5
