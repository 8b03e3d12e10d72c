"""Batch strategies: the built-ins, validation of decisions, user strategies."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, ref, submit

from llamapy.engine import (
    Balanced,
    BaseStrategy,
    BatchDecision,
    BatchView,
    DecodeMaximal,
    PrefillPriority,
    SlotView,
    resolve_strategy,
)
from llamapy.engine.engine import Engine
from llamapy.engine.testing import drain
from llamapy.errors import EngineError, InvalidOptionError


def slot(slot_id: int, remaining: int = 0, serial: int | None = None,
         last: float | None = None) -> SlotView:
    return SlotView(slot_id=slot_id, request_id=slot_id, prompt_tokens=remaining + 1,
                    num_computed=0, remaining_prefill=remaining, num_generated=0,
                    submitted_at=0.0, admitted_at=0.0, last_token_at=last,
                    serial=slot_id if serial is None else serial)


def view(decoding=(), prefilling=(), n_batch=16, chunk=8) -> BatchView:
    return BatchView(now=1.0, n_batch=n_batch, chunk_size=chunk, decoding=tuple(decoding),
                     prefilling=tuple(prefilling))


def test_decode_maximal_decodes_everyone_then_prefills_fifo():
    d = DecodeMaximal().allocate(view([slot(0), slot(1)], [slot(3, 20, serial=9),
                                                           slot(2, 5, serial=4)]))
    assert sorted(d.decode) == [0, 1]
    assert d.prefill == {2: 5, 3: 8 - 0} and d.n_tokens == 15


def test_decode_maximal_budget_is_n_batch():
    d = DecodeMaximal().allocate(view([slot(0)], [slot(1, 30), slot(2, 30)], n_batch=10))
    assert d.decode == [0] and d.prefill == {1: 8, 2: 1}


def test_prefill_follows_the_order_slots_were_admitted_in():
    """A run admitted first (the tenants' turns, a strategy's admission_order) prefills first,
    though another was submitted before it."""
    from dataclasses import replace

    early, late = replace(slot(1, 30, serial=9), admitted_at=0.5), replace(
        slot(2, 30, serial=3), admitted_at=0.7)
    for strategy in (DecodeMaximal(), PrefillPriority()):
        d = strategy.allocate(view([], [late, early], n_batch=8))
        assert d.prefill == {1: 8}, strategy
    d = Balanced(prefill_share=1.0).allocate(view([], [late, early], n_batch=9))
    assert d.prefill == {1: 5, 2: 4}  # an even share, the odd token to the first admitted


def test_prefill_priority_prefills_first():
    d = PrefillPriority().allocate(view([slot(0), slot(1)], [slot(2, 30)], n_batch=9))
    assert d.prefill == {2: 8} and len(d.decode) == 1


def test_prefill_priority_prefers_the_decoder_that_waited_longest():
    d = PrefillPriority().allocate(view([slot(0, last=5.0), slot(1, last=2.0)], [slot(2, 30)],
                                        n_batch=9))
    assert d.decode == [1]


def test_balanced_caps_prefill_while_decoding_and_shares_it():
    d = Balanced(prefill_share=0.25).allocate(view([slot(0)], [slot(1, 30), slot(2, 30)],
                                                   n_batch=32, chunk=16))
    assert d.decode == [0] and d.prefill == {1: 4, 2: 4}


def test_balanced_uses_the_whole_budget_without_decoders():
    d = Balanced().allocate(view([], [slot(1, 30), slot(2, 3)], n_batch=16, chunk=16))
    assert d.prefill == {1: 13, 2: 3}


def test_balanced_rejects_bad_share():
    with pytest.raises(InvalidOptionError):
        Balanced(prefill_share=0)


@pytest.mark.parametrize("spec", ["decode_maximal", "DecodeMaximal", DecodeMaximal,
                                  DecodeMaximal(), "balanced", "prefill_priority"])
def test_resolve_strategy(spec):
    assert callable(resolve_strategy(spec).allocate)


@pytest.mark.parametrize("spec", ["nope", 3, object(), Balanced.__init__])
def test_resolve_strategy_rejects(spec):
    with pytest.raises(InvalidOptionError):
        resolve_strategy(spec)


class Greedy(BaseStrategy):
    """Breaks the rules on purpose: prefills more than the budget."""

    name = "greedy"

    def allocate(self, view: BatchView) -> BatchDecision:
        return BatchDecision(prefill={s.slot_id: s.remaining_prefill for s in view.prefilling})


class Lazy(BaseStrategy):
    name = "lazy"

    def allocate(self, view: BatchView) -> BatchDecision:
        return BatchDecision()


@pytest.mark.parametrize("strategy", [Greedy(), Lazy()])
def test_engine_rejects_invalid_decisions(strategy):
    engine, _ = make_engine(batch_strategy=strategy, n_batch=8, chunk_size=4)
    sink = submit(engine, 1, list(range(1, 20)), max_tokens=2)
    assert engine.tick()  # the invalid decision fails the request, never the tick
    assert sink.finish_reason == "error"
    assert isinstance(sink.final.exc, InvalidOptionError)
    assert "batch_strategy" in str(sink.final.exc)
    assert all(s.is_free for s in engine.pool.slots)
    engine.check_integrity()


class Recording(DecodeMaximal):
    """A user strategy: shortest prompt admitted first; remembers what it saw."""

    name = "recording"

    def __init__(self) -> None:
        self.views: list[BatchView] = []

    def admission_order(self, queue, now):
        return sorted(range(len(queue)), key=lambda i: queue[i].prompt_tokens)

    def allocate(self, view: BatchView) -> BatchDecision:
        self.views.append(view)
        return super().allocate(view)


def test_user_strategy_sees_queue_and_orders_admission():
    strategy = Recording()
    engine, backend = make_engine(n_parallel=1, batch_strategy=strategy)
    sinks = {rid: submit(engine, rid, [1] * n, max_tokens=1, temp=0.0)
             for rid, n in [("long0", 9), ("long", 30), ("short", 3), ("mid", 10)]}
    engine.tick()
    first = strategy.views[0]
    assert first.queue_depth == 3 and {q.prompt_tokens for q in first.queue} == {30, 3, 10}
    drain(engine)
    order = [v.prefilling[0].request_id for v in strategy.views if v.prefilling]
    assert order == ["long0", "short", "mid", "long"]
    assert sinks["long"].tokens == ref(backend, [1] * 30, 1, temp=0.0)


@pytest.mark.parametrize("name", ["decode_maximal", "prefill_priority", "balanced"])
def test_every_strategy_gives_reference_results(name):
    engine, backend = make_engine(n_parallel=3, batch_strategy=name, n_batch=12, chunk_size=5)
    prompts = {i: [1, 2, 3] * (i + 2) + [i] for i in range(6)}
    sinks = {i: submit(engine, i, p, max_tokens=6, seed=i) for i, p in prompts.items()}
    drain(engine, each=engine.check_integrity)
    for plan in backend.plans:
        assert plan.n_tokens <= 12 and all(len(s.token_ids) <= 5 for s in plan.segments)
    for i, p in prompts.items():
        assert sinks[i].tokens == ref(backend, p, 6, seed=i)


class _Broken(DecodeMaximal):
    """A strategy whose batch decision raises after ``ok`` good ticks."""

    def __init__(self, ok: int = 0) -> None:
        self.ok = ok

    def allocate(self, view):  # type: ignore[no-untyped-def]
        if self.ok <= 0:
            raise ZeroDivisionError("strategy bug")
        self.ok -= 1
        return super().allocate(view)


def test_a_raising_strategy_fails_the_running_requests_and_the_engine_keeps_ticking():
    engine, backend = make_engine(n_parallel=2, batch_strategy=_Broken(ok=2))
    a = submit(engine, "a", list(range(1, 40)), max_tokens=20)
    b = submit(engine, "b", list(range(50, 60)), max_tokens=20)
    for _ in range(3):
        assert engine.tick()  # the third tick's decision raises: never out of tick()
    for sink in (a, b):
        assert sink.finish_reason == "error"
        assert isinstance(sink.final.exc, EngineError) and sink.final.exc.phase == "tick"
        assert isinstance(sink.final.exc.__cause__, ZeroDivisionError)
    assert all(s.is_free for s in engine.pool.slots) and not engine.runs
    engine.check_integrity()
    backend.check_integrity()
    engine.strategy.ok = 10**6  # fixed: later requests are served
    c = submit(engine, "c", list(range(1, 40)), max_tokens=3)
    drain(engine)
    assert c.tokens == ref(backend, list(range(1, 40)), 3)


def test_a_backend_raising_a_foreign_error_fails_only_that_batch():
    engine, backend = make_engine(n_parallel=1)
    real = backend.decode
    calls = {"n": 0}

    def flaky(plan):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("driver hiccup")
        return real(plan)

    backend.decode = flaky  # type: ignore[method-assign]
    a = submit(engine, "a", list(range(1, 10)), max_tokens=5)
    drain(engine)
    assert a.finish_reason == "error" and isinstance(a.final.exc, EngineError)
    b = submit(engine, "b", list(range(1, 10)), max_tokens=3)
    drain(engine)
    assert b.tokens == ref(backend, list(range(1, 10)), 3)
    engine.check_integrity()
    backend.check_integrity()


def _clocked_engine(clock: list[float]):  # type: ignore[no-untyped-def]
    engine, backend = make_engine(n_parallel=1, prompt_cache_ram_mb=1)
    return Engine(backend, engine.config, tuning=engine.tuning, clock=lambda: clock[0])


def _finish_order(engine, sinks: dict) -> list[object]:  # type: ignore[no-untyped-def]
    """Request ids in the order they finished (one slot: the order they were admitted)."""
    order: list[object] = []
    while engine.tick():
        order += [rid for rid, sink in sinks.items() if sink.final and rid not in order]
    return order


def test_a_warm_request_is_admitted_before_an_earlier_cold_one():
    """One slot; conversation A's history went to the RAM cache when another request took the
    slot. A's next turn, queued after a cold request, is admitted first and restores it; the
    cold one follows."""
    clock = [0.0]
    engine = _clocked_engine(clock)
    history = list(range(100, 160))
    submit(engine, "a1", history, max_tokens=1)
    drain(engine)
    blocker = submit(engine, "busy", [7, 7, 7], max_tokens=3)
    engine.tick()  # the slot is busy: both of the next requests queue
    cold = submit(engine, "cold", list(range(300, 340)), max_tokens=1)
    warm = submit(engine, "a2", [*history, 5, 6], max_tokens=1)
    assert [r.request_id for r in engine.queue] == ["cold", "a2"]
    engine.cancel("busy")
    assert blocker.finish_reason == "cancelled"
    assert _finish_order(engine, {"cold": cold, "a2": warm}) == ["a2", "cold"]
    assert warm.final.timings.reuse_source == "ram" and warm.final.timings.reused_tokens > 50
    assert cold.final.timings.reused_tokens == 0


def test_a_cold_request_that_waited_long_enough_goes_first():
    clock = [0.0]
    engine = _clocked_engine(clock)
    history = list(range(100, 160))
    submit(engine, "a1", history, max_tokens=1)
    drain(engine)
    submit(engine, "busy", [7, 7, 7], max_tokens=3)
    engine.tick()
    cold = submit(engine, "cold", list(range(300, 340)), max_tokens=1)
    clock[0] += DecodeMaximal.warm_first_max_wait_s  # the cold one is now overdue
    warm = submit(engine, "a2", [*history, 5, 6], max_tokens=1)
    engine.cancel("busy")
    assert _finish_order(engine, {"cold": cold, "a2": warm}) == ["cold", "a2"]


class _Counting(DecodeMaximal):
    """A user strategy (a subclass of a built-in) that counts its decisions."""

    def __init__(self) -> None:
        self.calls = 0

    def allocate(self, view):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().allocate(view)


def test_a_user_strategy_decides_every_tick_even_when_all_slots_decode():
    strategy = _Counting()
    engine, _ = make_engine(n_parallel=2, batch_strategy=strategy)
    submit(engine, "a", [1, 2, 3], max_tokens=8, temp=0.0)
    ticks = drain(engine)
    assert strategy.calls == ticks  # the built-ins' decode-only shortcut is not taken


@pytest.mark.parametrize("name", ["decode_maximal", "prefill_priority", "balanced"])
def test_the_decode_only_shortcut_builds_what_the_strategy_would(name):
    engine, _ = make_engine(n_parallel=4, batch_strategy=name, n_batch=3)
    for i in range(4):
        submit(engine, i, [1, 2, i + 3], max_tokens=40, temp=0.0)
    for _ in range(3):
        engine.tick()
    decoding = [s for s in engine.pool.running() if s.run is not None]
    for step, s in enumerate(decoding):  # distinct waits, so the order is decided by them
        assert s.run is not None
        s.run.last_token_at = 10.0 - step
    planner = engine.planner
    assert planner._plain
    short = planner.schedule(decoding, [], [], 1.0)
    planner._plain = False
    full = planner.schedule(decoding, [], [], 1.0)
    assert short is not None and full is not None
    assert [(e.slot.slot_id, e.token_ids, e.start_pos) for e in short.entries] == \
        [(e.slot.slot_id, e.token_ids, e.start_pos) for e in full.entries]
    assert len(short.entries) == 3  # n_batch caps it, the longest waiting first
