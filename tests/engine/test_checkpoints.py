"""Context checkpoints on a backend whose state cannot be trimmed (the fake's recurrent mode).

The fake backend's recurrent state continues every decode: a checkpoint restored from another
history, key or position is a violation and changes the output. So "the output equals the
reference" proves each restore put back the right state.
"""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, ref, submit

from llamapy.engine import FakeBackend, Request, RequestOptions, SamplingParams
from llamapy.engine.backend import BatchPlan, Segment
from llamapy.engine.cache.checkpoints import (
    Checkpoint,
    Checkpoints,
    checkpoint_positions,
    digest,
    pack,
    packed_size,
    positions,
    unpack,
)
from llamapy.engine.cache.disk import CacheNamespace
from llamapy.engine.testing import Recorder, drain


def hybrid(**config):
    config.setdefault("checkpoint_min_step", 64)
    config.setdefault("n_parallel", 2)
    config.setdefault("n_ctx", 4096)
    return make_engine(partial=False, **config)


def run(engine, backend, rid, prompt, n=4, **options):
    sink = submit(engine, rid, prompt, max_tokens=n, **options)
    drain(engine, each=backend.check_integrity)
    assert sink.finish_reason == "max_tokens", sink.events[-1]
    assert sink.tokens == ref(backend, prompt, n)
    return sink.final.timings


# --- the fake's recurrent state ---------------------------------------------------------------

def decode(backend, seg):
    backend.decode(BatchPlan([seg]))


def test_fake_recurrent_state_restores_and_trims_only_past_it():
    backend = FakeBackend(n_ctx=64, n_seq_max=2, supports_partial_removal=False)
    decode(backend, Segment(0, 0, [1, 2, 3, 4], True))
    early = backend.state_seq_get(0, partial=True)
    decode(backend, Segment(0, 4, [5, 6], True))
    assert backend.seq_rm(0, 4, -1) is False  # the state has absorbed 5 and 6
    assert backend.state_seq_set(0, early, partial=True)
    assert backend.seq_rm(0, 4, -1) and backend.seq_pos_max(0) == 3
    decode(backend, Segment(0, 4, [7], True))
    backend.check_integrity()
    fresh = FakeBackend(n_ctx=64, n_seq_max=1, supports_partial_removal=False)
    decode(fresh, Segment(0, 0, [1, 2, 3, 4, 7], True))
    assert backend.output_row(0) == fresh.output_row(4)


def test_fake_recurrent_state_of_another_history_is_a_violation():
    backend = FakeBackend(n_ctx=64, n_seq_max=2, supports_partial_removal=False)
    decode(backend, Segment(0, 0, [1, 2, 3], True))
    foreign = backend.state_seq_get(0, partial=True)
    decode(backend, Segment(1, 0, [9, 9, 9, 9], True))
    assert backend.state_seq_set(1, foreign, partial=True)
    assert backend.seq_rm(1, 3, -1)
    decode(backend, Segment(1, 3, [4], True))
    with pytest.raises(AssertionError, match="recurrent state"):
        backend.check_integrity()


def test_fake_partial_set_of_garbage_fails_and_empties():
    backend = FakeBackend(n_ctx=64, n_seq_max=1, supports_partial_removal=False)
    decode(backend, Segment(0, 0, [1, 2, 3], True))
    assert backend.state_seq_set(0, b"garbage", partial=True) is False
    assert backend.seq_pos_max(0) == -1


# --- the checkpoint list and its blob ---------------------------------------------------------

def test_checkpoints_keep_the_newest_and_spread_under_their_bounds():
    tokens = list(range(1000))
    held = Checkpoints()
    for n in (100, 110, 120, 400, 800):
        held.add(Checkpoint(n, digest(tokens[:n]), b"x" * 10), max_count=3, max_bytes=10_000)
    assert held.positions == [100, 400, 800]  # the closest after its predecessor went first
    held.add(Checkpoint(900, digest(tokens[:900]), b"y" * 25), max_count=9, max_bytes=50)
    assert held.positions == [400, 800, 900] and held.nbytes <= 50
    assert held.best(850, tokens).n_tokens == 800
    assert held.best(899, [7] * 1000) is None  # another history: no checkpoint applies
    held.drop_after(500)
    assert held.positions == [400]


def test_checkpoint_positions():
    assert checkpoint_positions(0, 300, 128) == [128, 256, 300]
    assert checkpoint_positions(130, 300, 128, hints=(290, 5, 400)) == [256, 290, 300]
    assert checkpoint_positions(10, 50, 0) == [50]


def test_blob_round_trip_and_bare_states():
    tokens = list(range(50))
    cks = [Checkpoint(10, digest(tokens[:10]), b"ten"), Checkpoint(40, digest(tokens[:40]), b"40")]
    blob = pack(b"STATE", cks)
    assert len(blob) == packed_size(5, cks) and positions(blob) == [10, 40]
    state, held = unpack(blob, tokens)
    assert state == b"STATE" and [c.state for c in held] == [b"ten", b"40"]
    assert held.best(45, tokens).n_tokens == 40
    state, held = unpack(b"plain state", tokens)
    assert state == b"plain state" and len(held) == 0
    assert unpack(blob[:-1], tokens)[1].positions == []  # truncated: a bare state


# --- the engine -------------------------------------------------------------------------------

def test_prompt_diverging_inside_the_cache_restores_the_checkpoint_before_it():
    engine, backend = hybrid()
    base = [(i * 7) % 500 + 1 for i in range(300)]
    run(engine, backend, "a", base)
    taken = engine.pool.slots[0].checkpoints.positions
    assert {64, 128, 192, 256, 300} <= set(taken)
    timings = run(engine, backend, "b", [*base[:200], 3, 3, 3])
    assert timings.reused_tokens == 192 and timings.reuse_source == "own"
    assert timings.checkpoint_tokens == 192 and timings.checkpoint_behind == 8
    assert engine.counters.num_checkpoint_restores == 1


def test_next_turn_reuses_the_end_of_the_previous_prompt():
    engine, backend = hybrid()
    turn1 = [(i * 5) % 400 + 1 for i in range(150)]
    run(engine, backend, "t1", turn1, n=6)
    turn2 = turn1 + [9, 9, 9] + [(i * 3) % 400 + 1 for i in range(40)]  # output re-rendered
    timings = run(engine, backend, "t2", turn2)
    assert timings.reused_tokens == 150 and timings.checkpoint_tokens == 150


def test_hints_place_checkpoints_where_the_next_turn_diverges():
    engine, backend = hybrid(checkpoint_min_step=0, n_parallel=1)
    prompt = [(i * 11) % 300 + 1 for i in range(100)]
    sink = Recorder()
    engine.submit(Request("h", prompt, RequestOptions(max_tokens=2,
                                                      sampling=SamplingParams(seed=1)),
                          sink, checkpoint_hints=(97, 5000)))
    drain(engine, each=backend.check_integrity)
    assert engine.pool.slots[0].checkpoints.positions == [97, 100]
    timings = run(engine, backend, "next", [*prompt[:98], 1, 2])  # the header re-rendered
    assert timings.reused_tokens == 97 and timings.checkpoint_behind == 1


def test_checkpoints_off_reuse_exact_extensions_only():
    engine, backend = hybrid(ctx_checkpoints=0)
    base = [(i * 7) % 500 + 1 for i in range(200)]
    run(engine, backend, "a", base)
    assert engine.pool.slots[0].checkpoints.positions == []
    assert run(engine, backend, "b", [*base[:150], 4]).reused_tokens == 0


def test_checkpoints_travel_through_the_ram_cache():
    engine, backend = hybrid(prompt_cache_ram_mb=64, n_parallel=1)
    make = lambda seed: [(i * seed) % 450 + 1 for i in range(260)]  # noqa: E731
    run(engine, backend, "a", make(7))
    run(engine, backend, "b", make(13))  # a takes a's slot: a's prefix goes to RAM
    timings = run(engine, backend, "c", [*make(7)[:140], 2, 2])
    assert timings.reuse_source == "ram" and timings.reused_tokens == 128
    assert timings.checkpoint_tokens == 128


def test_a_checkpoint_never_crosses_a_cache_key():
    engine, backend = hybrid(prompt_cache_ram_mb=64)
    base = [(i * 7) % 500 + 1 for i in range(200)]
    run(engine, backend, "a", base, cache_scope="one")
    timings = run(engine, backend, "b", [*base[:150], 4], cache_scope="two")
    assert timings.reused_tokens == 0 and timings.checkpoint_tokens == 0


@pytest.mark.parametrize("unified", [True, False])
def test_a_busy_slot_donates_its_prefix_back_to_a_checkpoint(unified):
    engine, backend = hybrid(unified=unified, n_ctx=2048)
    system = [(i * 7) % 500 + 1 for i in range(200)]
    run(engine, backend, "warm", [*system, 4, 4])
    warm = next(s for s in engine.pool.slots if s.cached)
    busy = submit(engine, "busy", [*system, 4, 4, 5], max_tokens=30, session="s")
    assert engine.runs["busy"].slot is warm
    timings = run(engine, backend, "new", [*system, 9, 8, 7])
    assert timings.reuse_source == "donor" and timings.reused_tokens == 192
    assert timings.checkpoint_tokens == 192 and timings.checkpoint_behind == 8
    drain(engine, each=backend.check_integrity)
    assert busy.tokens == ref(backend, [*system, 4, 4, 5], 30)  # the donor is untouched


def test_a_donor_without_a_checkpoint_in_the_shared_part_gives_nothing():
    engine, backend = hybrid(checkpoint_min_step=0)
    system = [(i * 7) % 500 + 1 for i in range(200)]
    run(engine, backend, "warm", [*system, 4, 4])
    submit(engine, "busy", [*system, 4, 4, 5], max_tokens=30, session="s")
    timings = run(engine, backend, "new", [*system, 9, 8, 7])
    assert timings.reused_tokens == 0 and engine.counters.reused["donor"] == 0


def test_the_disk_index_knows_a_files_checkpoints_before_reading_it(tmp_path):
    from disk_helpers import TOKENS, K, cache, sized

    held = [Checkpoint(40, digest(TOKENS[:40]), b"s" * 9),
            Checkpoint(80, digest(TOKENS[:80]), b"t" * 9)]
    disk = cache(tmp_path)
    assert disk.offer(K, TOKENS, *sized(pack(b"state" * 50, held)))
    disk.close()
    again = cache(tmp_path)  # a restart: files indexed from their headers
    found, n = again.lookup(K, [*TOKENS[:90], 7, 7], cap=200)
    assert n == 90 and list(again.checkpoint_positions(found)) == [40, 80]
    bare = cache(tmp_path / "bare")
    assert bare.offer(K, TOKENS, *sized(b"state" * 50))
    bare.close()
    found, _ = cache(tmp_path / "bare").lookup(K, TOKENS, cap=200)
    assert list(cache(tmp_path / "bare").checkpoint_positions(found)) == []


def test_a_disk_entry_sharing_more_loses_to_a_slot_that_can_resume_further(tmp_path):
    system = [(i * 7) % 500 + 1 for i in range(200)]
    first, _ = hybrid(n_parallel=1, checkpoint_min_step=0, prompt_cache_dir=str(tmp_path),
                      cache_namespace=CacheNamespace("hybrid"))
    run(first, first.backend, "long", [*system, 5, 5, 5])  # checkpoint at its end only
    first.close()
    engine, backend = hybrid(n_parallel=1, prompt_cache_dir=str(tmp_path),
                             cache_namespace=CacheNamespace("hybrid"))
    run(engine, backend, "own", [*system[:150], 6, 5, 4])  # checkpoints at 64 and 128
    timings = run(engine, backend, "next", [*system, 9, 8, 7])
    assert timings.reuse_source == "own" and timings.reused_tokens == 128


def _blob(tokens, at):
    return pack(b"state" * 20, [Checkpoint(n, digest(tokens[:n]), b"c" * 5) for n in at])


def test_ram_entries_cover_a_shorter_prefix_only_where_they_resume():
    from disk_helpers import K, sized

    from llamapy.engine.cache.ram import PromptCache

    long = tuple(range(1, 101))
    for resume_points in (False, True):
        ram = PromptCache(1 << 20, min_tokens=4)
        ram.resume_points = resume_points
        assert ram.offer(K, long, *sized(_blob(long, [40])))
        assert ram.covers(K, long[:40]) and ram.covers(K, long)
        assert ram.covers(K, long[:60]) is not resume_points  # no checkpoint at 60
        if resume_points:
            assert ram.offer(K, long[:60], *sized(_blob(long, [])))  # kept, not covered
            longer = (*long, 7, 7)
            assert ram.offer(K, longer, *sized(_blob(longer, [60])))  # resumes at 60
            kept = sorted(len(e.token_ids) for e in ram.entries())
            assert kept == [100, 102]  # 60 dropped (covered at a checkpoint), 100 kept


def test_disk_files_cover_a_shorter_prefix_only_where_they_resume(tmp_path):
    from disk_helpers import K, cache, sized

    long = tuple(range(1, 101))
    disk = cache(tmp_path)
    disk.resume_points = True
    assert disk.offer(K, long, *sized(_blob(long, [40])), wait=True)
    assert disk.covers(K, long[:40]) and not disk.covers(K, long[:60])
    assert disk.offer(K, long[:60], *sized(_blob(long, [])), wait=True)
    longer = (*long, 7, 7)
    assert disk.offer(K, longer, *sized(_blob(longer, [60])), wait=True)
    disk.close()
    again = cache(tmp_path)
    lengths = sorted(len(f.header.token_ids) for f in again._index.files.values())
    assert lengths == [100, 102]
