"""Steady decode on an asynchronous device (:mod:`llamapy.engine.steady`): a tick chains plain
decode steps, each laid out while the one before computes, and the answers are the ones a
synchronous backend gives; the chain stops when a run ends (its budget, an end of generation, a
stop string found while the next step computed), when the owner has something for the engine
(``keep_going``) and at ``steady_steps``; nothing chains on a synchronous backend or while a
slot prefills."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from engine_helpers import make_engine, ref, submit

from llamapy.engine import Engine, EngineConfig, EngineTuning, FakeBackend, FakeModel
from llamapy.engine.fake.device import DeviceCost
from llamapy.engine.fake.model import CostModel
from llamapy.engine.testing import Recorder, drain

PROMPTS = ([1, 2, 3, 4, 5], [9, 8, 7, 6], [20, 21, 22])
BUDGETS = (40, 17, 29)
#: Every run to its budget (the fake model's end-of-generation token is 0).
NO_EOG: dict[str, object] = {"logit_bias": {0: float("-inf")}}


def engine_on(device: bool, steady_steps: int = 32, n_parallel: int = 3
              ) -> tuple[Engine, FakeBackend]:
    return make_engine(n_parallel=n_parallel,
                       tuning=EngineTuning(ram_min_tokens=4, steady_steps=steady_steps),
                       backend_kw={"device": DeviceCost(0.0) if device else None})


def serve(engine: Engine, **options: object) -> list[Recorder]:
    sinks = [submit(engine, i, prompt, max_tokens=budget, **NO_EOG, **options)
             for i, (prompt, budget) in enumerate(zip(PROMPTS, BUDGETS, strict=True))]
    drain(engine, each=lambda: engine.check_integrity())
    return sinks


def answers(sinks: list[Recorder]) -> list[tuple[list[int], str, str | None]]:
    return [(s.tokens, s.text, s.finish_reason) for s in sinks]


def test_a_chained_decode_answers_as_a_synchronous_one() -> None:
    sync, _ = engine_on(device=False)
    chained, backend = engine_on(device=True)
    unchained, _ = engine_on(device=True, steady_steps=0)
    expected = answers(serve(sync))
    assert answers(serve(chained)) == expected == answers(serve(unchained))
    assert [tokens for tokens, _, _ in expected] == [
        ref(backend, p, n, **NO_EOG) for p, n in zip(PROMPTS, BUDGETS, strict=True)]
    assert sync.counters.num_steady_steps == unchained.counters.num_steady_steps == 0
    assert chained.counters.num_steady_steps > 0
    assert chained.counters.num_ticks < unchained.counters.num_ticks
    assert chained.counters.num_decode_calls == unchained.counters.num_decode_calls
    assert not backend.violations


def test_a_stop_string_found_while_the_next_step_computes_ends_the_run_there() -> None:
    sync, _ = engine_on(device=False)
    text = serve(sync)[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    expected = answers(serve(engine_on(device=False)[0], stop=[stop]))
    chained, backend = engine_on(device=True)
    got = answers(serve(chained, stop=[stop]))
    assert got == expected and got[0][2] == "stop" and stop not in got[0][1]
    assert chained.counters.num_steady_steps > 0 and not backend.violations


def ticks_with(engine: Engine, keep_going: Callable[[], bool]) -> list[int]:
    """Decode calls of each tick until the engine is idle."""
    calls = []
    while True:
        before = engine.counters.num_decode_calls
        if not engine.tick(keep_going):
            return calls
        calls.append(engine.counters.num_decode_calls - before)


@pytest.mark.parametrize("steady_steps", [1, 5])
def test_a_tick_chains_at_most_steady_steps(steady_steps: int) -> None:
    engine, _ = engine_on(device=True, steady_steps=steady_steps)
    sinks = [submit(engine, i, p, max_tokens=60, **NO_EOG)
             for i, p in enumerate(PROMPTS)]
    calls = ticks_with(engine, lambda: True)
    assert max(calls) == steady_steps + 1
    assert all(s.finish_reason == "max_tokens" and len(s.tokens) == 60 for s in sinks)


def test_the_chain_stops_when_the_owner_has_work_for_the_engine() -> None:
    engine, _ = engine_on(device=True)
    submit(engine, "a", PROMPTS[0], max_tokens=60, **NO_EOG)
    assert set(ticks_with(engine, lambda: False)) == {1}
    engine.check_integrity()
    allowed = iter([True, True, False])  # two more steps, then the inbox has something
    submit(engine, "b", PROMPTS[1], max_tokens=60, **NO_EOG)
    engine.tick()  # (its prefill: no chain while a slot prefills)
    before = engine.counters.num_decode_calls
    engine.tick(lambda: next(allowed, False))
    assert engine.counters.num_decode_calls - before == 3


def test_no_chain_on_a_synchronous_backend_or_while_a_slot_prefills() -> None:
    engine, _ = engine_on(device=False)
    submit(engine, "a", PROMPTS[0], max_tokens=30, **NO_EOG)
    assert set(ticks_with(engine, lambda: True)) == {1}
    engine, _ = engine_on(device=True, n_parallel=2)
    submit(engine, "a", PROMPTS[0], max_tokens=30, **NO_EOG)
    engine.tick()
    submit(engine, "b", list(range(30, 130)), max_tokens=4, **NO_EOG)
    before = engine.counters.num_decode_calls
    engine.tick()  # b prefills in this tick's batch: one step
    assert engine.counters.num_decode_calls - before == 1


def test_an_asynchronous_step_is_timed_until_its_outputs_are_read() -> None:
    """A decode that only queues its step returns at once: the pass-cost fit must see the
    step (every sample at least the device's step), not the call."""
    step = 0.004
    engine, _ = make_engine(n_parallel=3, backend_kw={"device": DeviceCost(step)})
    for i, prompt in enumerate(PROMPTS):
        submit(engine, i, prompt, max_tokens=3, **NO_EOG)
    drain(engine)
    samples = [t for ts in engine.speculator.cost._samples.values() for t in ts]
    assert samples and min(samples) >= step


@pytest.mark.parametrize(("token_s", "together"), [(0.0, True), (0.05, False)])
def test_prefills_pack_where_a_pass_costs_the_same_whatever_its_size(
        token_s: float, together: bool) -> None:
    """On a GPU-like device (a fixed cost per pass, no slope) the strategy packs prefills
    that arrive together; where each token costs (a CPU) it finishes one a tick."""
    backend = FakeBackend(n_ctx=2048, n_seq_max=6, model=FakeModel(n_vocab=512),
                          cost=CostModel(step_s=0.01, token_s=token_s), device=DeviceCost(0.0))
    engine = Engine(backend, EngineConfig(n_parallel=6), clock=backend.clock.now)
    for i, n in enumerate((1, 2, 4, 8)):  # decodes of several sizes teach the fit
        submit(engine, f"w{i}", list(range(1, n + 2)), max_tokens=2, **NO_EOG)
        drain(engine)
    sinks = [submit(engine, i, [100 + 4 * i + j for j in range(4)], max_tokens=2, **NO_EOG)
             for i in range(5)]  # (no shared prefix: nothing waits for another's)
    while not any(s.tokens for s in sinks):
        engine.tick()
    started = sum(bool(s.tokens) for s in sinks)  # first tokens in the first such tick
    assert started == (len(sinks) if together else 1)
    drain(engine)
