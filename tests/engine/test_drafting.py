"""The n-gram drafter: its incremental index against a brute-force search, and the pool it
learns from finished requests, scoped by cache key (``cache_scope``, identity, adapter set) as
KV reuse is: a request is never proposed text learned under another key."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from spec_helpers import (
    AuditedNgramDrafter,
    job,
    reference_of,
    run_jobs,
    spec_engine,
    submit_jobs,
)

from llamapy.engine import FakeModel, Request, RequestOptions
from llamapy.engine.request import CacheKey, Run
from llamapy.engine.slots import Slot
from llamapy.engine.speculation.drafting import (
    POOL_NGRAM,
    DraftJob,
    NgramDrafter,
    NgramIndex,
    NgramPool,
)
from llamapy.engine.speculation.speculator import Speculation
from llamapy.options.speculative import SpeculativeParams

ENDLESS = FakeModel(n_vocab=512, eog_permille=0)
TEXT = [*range(100, 140)]  # no repeated n-gram
KEY_A = CacheKey("a", "", ())
OTHER_KEYS = (CacheKey("b", "", ()), CacheKey(None, "", ()), CacheKey("a", "x", ()),
              CacheKey("a", "", (("l.gguf", 1.0),)))


def brute_lookup(tokens: list[int], n_max: int, max_n: int, min_n: int = 2) -> list[int]:
    """What followed the latest earlier occurrence of the longest n-gram ending ``tokens``."""
    end = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if end < n:
            continue
        gram = tokens[end - n:]
        for e in range(end - 1, n - 1, -1):  # an occurrence ending at e, continued by tokens[e]
            if tokens[e - n:e] == gram:
                return tokens[e:e + n_max]
    return []


@given(tokens=st.lists(st.integers(0, 3), max_size=40),
       steps=st.lists(st.integers(0, 5), min_size=1, max_size=20),
       n_max=st.integers(1, 6), max_n=st.integers(2, 5))
def test_incremental_index_equals_a_brute_force_search(tokens, steps, n_max, max_n):
    index, end = NgramIndex(max_n), 0
    for step in [*steps, len(tokens)]:
        end = min(len(tokens), end + step)
        assert index.lookup(tokens[:end], n_max) == brute_lookup(tokens[:end], n_max, max_n)


def test_index_prefers_the_longest_then_the_latest_match():
    tokens = [1, 2, 3, 4, 9, 7, 3, 4, 8, 3, 4, 6, 1, 2, 3, 4]
    assert NgramIndex(4).lookup(tokens, 3) == [9, 7, 3]  # the 4-gram, not the later 2-gram
    assert NgramIndex(2).lookup(tokens, 3) == [6, 1, 2]  # the latest 2-gram
    assert NgramIndex(4).lookup([1, 2, 3], 3) == []


def make_run(key: CacheKey, tokens: list[int], serial: int, **spec) -> Run:
    options = RequestOptions(cache_scope=key.cache_scope, adapters=key.adapter_set)
    request = Request(serial, tokens, options, cache_identity=key.cache_identity)
    run = Run(request, serial, True, None, 0.0, prompt=list(tokens), tokens=list(tokens))
    if spec:
        run.spec = Speculation(SpeculativeParams(type="ngram", **spec))
    return run


def propose(drafter: NgramDrafter, run: Run, n_max: int = 4) -> DraftJob:
    draft = DraftJob(Slot(0), run, n_max)
    drafter.propose([draft])
    return draft


def test_pool_tables_are_per_cache_key():
    pool = NgramPool()
    pool.learn(KEY_A, TEXT)
    assert pool.lookup(KEY_A, TEXT[:10], 4) == TEXT[10:14]
    for key in OTHER_KEYS:
        assert pool.lookup(key, TEXT[:10], 4) == []
    assert pool.keys() == [KEY_A]


def test_pool_is_bounded_in_keys_and_entries():
    pool = NgramPool(max_keys=2, max_entries=5, span=3)
    for i, key in enumerate((KEY_A, *OTHER_KEYS[:2])):
        pool.learn(key, TEXT[i:i + 20])
    assert pool.keys() == list(OTHER_KEYS[:2])  # the least recently learned key went first
    key = OTHER_KEYS[1]
    assert pool.lookup(key, TEXT[2:2 + POOL_NGRAM], 8) == []  # an early n-gram was dropped
    assert pool.lookup(key, TEXT[2:18], 8) == TEXT[18:21]  # span bounds the continuation


def test_drafter_learns_finished_runs_under_their_key_only():
    drafter = NgramDrafter()
    first = make_run(KEY_A, TEXT, serial=1)
    assert propose(drafter, first).tokens == []  # no repeats: nothing to propose
    drafter.finished(first)
    assert drafter.pool.keys() == [KEY_A]
    same = propose(drafter, make_run(KEY_A, TEXT[:12], serial=2))
    assert same.tokens == TEXT[12:16] and same.source == KEY_A
    for serial, key in enumerate(OTHER_KEYS, start=3):
        other = propose(drafter, make_run(key, TEXT[:12], serial=serial))
        assert other.tokens == [] and other.source is None, key


def test_drafter_learns_nothing_from_a_run_it_never_drafted_for():
    drafter = NgramDrafter()
    drafter.finished(make_run(KEY_A, TEXT, serial=1))
    assert drafter.pool.keys() == []


def test_own_text_comes_before_the_pool():
    drafter = NgramDrafter()
    drafter.pool.learn(KEY_A, [5, 6, 7, 50, 51])
    run = make_run(KEY_A, [5, 6, 7, 8, 9, 5, 6, 7], serial=1)
    assert propose(drafter, run).tokens == [8, 9, 5, 6]


def test_a_requests_ngram_size_is_the_longest_match():
    tokens = [1, 2, 3, 4, 9, 7, 3, 4, 8, 3, 4, 6, 1, 2, 3, 4]
    drafter = NgramDrafter(ngram_size=4)
    assert propose(drafter, make_run(KEY_A, tokens, 1, ngram_size=4), 3).tokens == [9, 7, 3]
    assert propose(drafter, make_run(KEY_A, tokens, 2, ngram_size=2), 3).tokens == [6, 1, 2]


# --- through the engine --------------------------------------------------------------------


def scoped_engine():
    ngram = AuditedNgramDrafter()
    engine, backend = spec_engine(model=ENDLESS, ngram=ngram, n_parallel=1, spec_type="ngram",
                                  spec_adaptive=False)
    return ngram, engine, backend


def test_a_request_never_gets_drafts_learned_under_another_key():
    ngram, engine, backend = scoped_engine()
    c = engine.counters
    first = job("a1", TEXT[:16], max_tokens=30, scope="a")
    run_jobs(engine, backend, [first])
    assert c.num_draft_tokens == 0, "the first request's own text has repeats"
    assert ngram.pool.keys() == [KEY_A]
    # Same prompt and seed: the same tokens, which the pool of scope "a" would propose.
    others = [job("b", TEXT[:16], max_tokens=30, scope="b"),
              job("none", TEXT[:16], max_tokens=30),
              job("identity", TEXT[:16], max_tokens=30, scope="a", identity="x")]
    sinks = run_jobs(engine, backend, others)
    for j, sink in zip(others, sinks, strict=True):
        assert sink.tokens == reference_of(backend, j) == first.sink.tokens
        assert sink.final.timings.draft_tokens == 0, j.request_id
    assert c.num_draft_tokens == 0 and not backend.violations


def test_pool_learned_drafts_are_used_within_the_same_key():
    ngram, engine, backend = scoped_engine()
    c = engine.counters
    run_jobs(engine, backend, [job("a1", TEXT[:16], max_tokens=30, scope="a")])
    assert c.num_draft_tokens == 0
    (sink,) = run_jobs(engine, backend, [j := job("a2", TEXT[:16], max_tokens=30, scope="a")])
    assert sink.tokens == reference_of(backend, j)
    assert c.num_draft_accepted > 0 and sink.final.timings.draft_accepted == c.num_draft_accepted
    assert ngram.num_proposed > 0


def test_a_requests_ngram_size_reaches_its_run():
    _, engine, _ = scoped_engine()
    submit_jobs(engine, [job(1, TEXT[:8], speculative={"ngram_size": 2}), job(2, TEXT[:8])])
    sizes = {rid: run.spec.params.ngram_size for rid, run in engine.runs.items() if run.spec}
    assert sizes == {1: 2, 2: 4}
