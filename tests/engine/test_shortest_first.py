"""The ``shortest_first`` batch strategy: the shortest remaining prefill first, one chunk of
prefill per tick, and a bound on how long any request waits (proved on the fake backend's
simulated clock over random workloads)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from engine_helpers import make_engine, ref, submit
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.engine import (
    BatchView,
    CostModel,
    DoneEvent,
    Engine,
    EngineConfig,
    EngineTuning,
    FakeBackend,
    FakeModel,
    QueuedView,
    ShortestFirst,
    SimClock,
    SlotView,
    resolve_strategy,
)
from llamapy.engine.testing import Recorder, drain
from llamapy.errors import InvalidOptionError


def slot(slot_id: int, remaining: int = 0, admitted: float = 0.9) -> SlotView:
    return SlotView(slot_id=slot_id, request_id=slot_id, prompt_tokens=remaining + 1,
                    num_computed=0, remaining_prefill=remaining, num_generated=0,
                    submitted_at=0.0, admitted_at=admitted, last_token_at=None, serial=slot_id)


def allocate(decoding=(), prefilling=(), n_batch=64, chunk=16, now=1.0, wait=2.0,
             pass_tokens=0.0):
    return ShortestFirst(max_wait_s=wait).allocate(BatchView(
        now=now, n_batch=n_batch, chunk_size=chunk, decoding=tuple(decoding),
        prefilling=tuple(prefilling), pass_tokens=pass_tokens))


def test_the_shortest_prefill_goes_first_and_a_tick_finishes_one_prefill():
    d = allocate([slot(0), slot(1)], [slot(2, 30), slot(3, 5), slot(4, 9)])
    assert sorted(d.decode) == [0, 1]  # every decoding slot gets its token
    assert d.prefill == {3: 5}  # the 9 and the 30 tokens would only delay its first token
    assert allocate([], [slot(2, 30), slot(4, 9)]).prefill == {4: 9}
    assert allocate([], [slot(2, 30)]).prefill == {2: 16}  # a chunk of a longer one


def test_a_prefill_joins_the_tick_when_it_finishes_and_costs_less_than_a_pass_each():
    three = [slot(2, 30), slot(3, 5), slot(4, 9)]
    # 9 tokens cost less than the 2 passes of 5 tokens' cost it saves the two still waiting
    assert allocate([], three, pass_tokens=5.0).prefill == {3: 5, 4: 9}
    assert allocate([], three, pass_tokens=4.0).prefill == {3: 5}
    # the 30 does not finish within the chunk, so it never joins
    assert allocate([], three, pass_tokens=100.0).prefill == {3: 5, 4: 9}


def test_without_decoders_prefill_is_still_one_chunk_a_tick():
    assert allocate([], [slot(1, 100), slot(2, 100)]).prefill == {1: 16}
    # a full n_batch of decoders leaves no prefill, as decode_maximal does
    assert allocate([slot(i) for i in range(4)], [slot(9, 5)], n_batch=4).prefill == {}


def test_a_slot_prefilling_for_max_wait_goes_first_oldest_first():
    old, older = slot(2, 400, admitted=0.0), slot(3, 300, admitted=-0.5)
    d = allocate([], [slot(1, 3), old, older], now=2.0, wait=2.0)
    assert list(d.prefill) == [3]  # overdue and admitted first: the whole chunk
    d = allocate([], [slot(1, 3), old, older], now=1.4, wait=2.0)
    assert d.prefill == {1: 3}  # none overdue: the shortest, alone


def queued(i: int, prompt: int, cached: int = 0, submitted: float = 0.0) -> QueuedView:
    return QueuedView(request_id=i, prompt_tokens=prompt, submitted_at=submitted, serial=i,
                      cached_tokens=cached)


def test_admission_takes_the_fewest_tokens_to_compute_first_and_the_overdue_before_all():
    strategy = ShortestFirst(max_wait_s=2.0)
    queue = [queued(0, 500), queued(1, 900, cached=850), queued(2, 100), queued(3, 100)]
    assert list(strategy.admission_order(queue, now=1.0)) == [1, 2, 3, 0]
    late = [queued(0, 500, submitted=-1.5), queued(1, 50), queued(2, 800, submitted=-1.0)]
    assert list(strategy.admission_order(late, now=1.0)) == [0, 2, 1]  # oldest first


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1"])
def test_max_wait_is_checked(bad):
    with pytest.raises(InvalidOptionError):
        ShortestFirst(max_wait_s=bad)


def test_it_is_a_named_built_in_that_gives_reference_results():
    assert isinstance(resolve_strategy("shortest_first"), ShortestFirst)
    assert isinstance(resolve_strategy("ShortestFirst"), ShortestFirst)
    engine, backend = make_engine(n_ctx=2048, n_parallel=3, batch_strategy="shortest_first",
                                  chunk_size=8, n_batch=16)
    prompts = [list(range(1, 40)), [5, 6, 7], list(range(100, 160))]
    sinks = [submit(engine, i, p, max_tokens=6) for i, p in enumerate(prompts)]
    drain(engine)
    for sink, prompt in zip(sinks, prompts, strict=True):
        assert sink.tokens == ref(backend, prompt, 6)
    assert [s.final.timings.ttft_s for s in sinks].index(  # type: ignore[union-attr]
        min(s.final.timings.ttft_s for s in sinks)) == 1  # type: ignore[union-attr]


# --- the wait bound ------------------------------------------------------------------------------

COST = CostModel(step_s=0.01, token_s=0.001)
WAIT = 0.5


@dataclass(frozen=True)
class Load:
    n_parallel: int
    chunk: int
    max_tokens: int
    arrivals: tuple[tuple[float, int], ...]  # (submitted at, prompt tokens)


@st.composite
def loads(draw: st.DrawFn) -> Load:
    n = draw(st.integers(1, 24))
    times = sorted(draw(st.lists(st.floats(0, 8), min_size=n, max_size=n)))
    sizes = draw(st.lists(st.sampled_from([1, 3, 20, 64, 150, 400, 900]), min_size=n,
                          max_size=n))
    return Load(draw(st.integers(1, 4)), draw(st.sampled_from([8, 32, 128])),
                draw(st.integers(1, 6)), tuple(zip(times, sizes, strict=True)))


def run_load(load: Load, strategy: object = None) -> tuple[list[DoneEvent], float]:
    """Run ``load`` on a simulated clock (``strategy``: default ``shortest_first``); each
    request's done event and the longest a tick may take."""
    clock = SimClock()
    n_batch = load.chunk + load.n_parallel
    backend = FakeBackend(n_ctx=8192, n_seq_max=load.n_parallel, n_batch=n_batch,
                          model=FakeModel(n_vocab=50_000, eog_permille=0), cost=COST,
                          clock=clock)
    config = EngineConfig(n_parallel=load.n_parallel, chunk_size=load.chunk, n_batch=n_batch,
                          cache_prompt=False,
                          batch_strategy=strategy or ShortestFirst(max_wait_s=WAIT))
    engine = Engine(backend, config, tuning=EngineTuning(inflight_dedup=False),
                    clock=clock.now)
    sinks: list[Recorder] = []
    pending = list(load.arrivals)
    while pending or engine.has_work:
        while pending and pending[0][0] <= clock.now():
            size = pending.pop(0)[1]
            prompt = [10_000 + 97 * len(sinks) + i for i in range(size)]  # nothing shared
            sinks.append(submit(engine, len(sinks), prompt, max_tokens=load.max_tokens))
        if engine.has_work:
            engine.tick()
        elif pending:
            clock.t = pending[0][0]
    done = [sink.final for sink in sinks]
    assert all(isinstance(d, DoneEvent) for d in done)
    return done, COST.decode_time(n_batch)  # type: ignore[return-value]


def prefill_bound(load: Load, tick: float, wait: float = WAIT) -> float:
    """The longest an admitted request may wait for its first token."""
    biggest = max(size for _, size in load.arrivals)
    return wait + (load.n_parallel * math.ceil(biggest / load.chunk) + 2) * tick


@settings(max_examples=150, deadline=None)
@given(loads())
def test_no_request_waits_longer_than_the_bound(load: Load) -> None:
    """Admitted: its first token within ``max_wait_s`` plus the prefill, one chunk a tick, of
    itself and the at most ``n_parallel - 1`` slots admitted before it. Queued: admitted
    within ``max_wait_s`` plus the service of every request that arrived before it, ``n_parallel``
    at a time (overdue requests are admitted oldest first)."""
    done, tick = run_load(load)
    service = prefill_bound(load, tick) + (load.max_tokens + 1) * tick
    for k, event in enumerate(done):
        timings = event.timings
        assert timings.ttft_s is not None
        assert timings.ttft_s - timings.queued_s <= prefill_bound(load, tick) + 1e-9, (k, timings)
        rounds = math.ceil((k + 1) / load.n_parallel) + 1
        assert timings.queued_s <= WAIT + rounds * service + 1e-9, (k, timings)


def test_a_long_prompt_is_not_starved_by_a_stream_of_shorter_ones():
    """One 900-token prompt among 150-token prompts arriving faster than two slots serve them:
    it gets its first token within the bound; with no aging it would wait for the stream to
    dry up (which is what the bound guards against)."""
    arrivals = ((0.0, 150), (0.0, 900), *((0.05 + 0.1 * i, 150) for i in range(60)))
    load = Load(2, 8, 1, arrivals)
    for strategy, within in ((ShortestFirst(max_wait_s=WAIT), True),
                             (ShortestFirst(max_wait_s=1000.0), False)):
        done, tick = run_load(load, strategy)
        waited = (done[1].timings.ttft_s or 0.0) - done[1].timings.queued_s
        assert (waited <= prefill_bound(load, tick)) is within, (strategy.max_wait_s, waited)


def test_short_requests_get_their_first_token_sooner_than_with_fifo_prefill():
    """Four requests at once (800, 800, 40 and 40 tokens): the short ones' first tokens come
    after a chunk instead of after everyone's prefill; the mean time to first token drops."""
    load = Load(4, 128, 2, ((0.0, 800), (0.0, 800), (0.0, 40), (0.0, 40)))
    fifo = [d.timings.ttft_s or 0.0 for d in run_load(load, "decode_maximal")[0]]
    short = [d.timings.ttft_s or 0.0 for d in run_load(load)[0]]
    assert max(short[2:]) < min(fifo[2:]) / 3
    assert sum(short) < sum(fifo)


def test_the_pass_cost_is_learned_bounded_and_reaches_the_strategy():
    from llamapy.engine.speculation.speculator import MAX_FIT_TOKENS, DecodeCost

    cost = DecodeCost(0.5)
    assert cost.pass_tokens == 0.0  # nothing learned yet
    for n, seconds in ((1, 0.0085), (2, 0.011), (4, 0.016)):
        cost.record(n, seconds)
    assert cost.pass_tokens == pytest.approx(2.4, abs=0.05)  # a = 6 ms, b = 2.5 ms
    cost.record(8, 0.026)  # (a new sample refreshes the kept fit)
    assert cost.pass_tokens == pytest.approx(2.4, abs=0.05)
    flat = DecodeCost(0.5)
    for n in (1, 2, 4, 8):
        flat.record(n, 0.010 + 1e-7 * n)  # a GPU: passes cost the same at these sizes
    assert flat.pass_tokens == MAX_FIT_TOKENS  # not the 100,000 the fit would extrapolate
    for slope in (0.0, -1e-7):  # exactly flat, or noise making it fall: still a GPU's pass
        level = DecodeCost(0.5)
        for n in (1, 2, 4, 8):
            level.record(n, 0.010 + slope * n)
        assert level.pass_tokens == MAX_FIT_TOKENS
    engine, _ = make_engine(n_ctx=256, n_parallel=2)
    for n, seconds in ((1, 0.0085), (2, 0.011)):
        engine.speculator.cost.record(n, seconds)
    assert engine.planner.pass_tokens() == pytest.approx(engine.speculator.cost.pass_tokens)
