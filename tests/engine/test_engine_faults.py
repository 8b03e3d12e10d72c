"""Faults inside the engine stay with the request they concern: a foreign error in
``Engine.submit`` is an ``EngineError`` that leaves nothing behind, a sampler built ahead is
closed whenever ``submit`` refuses its request, and a queued run whose routing raises ends
alone, without ``has_work`` or the tick raising for it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from llamapy.engine import Engine, EngineConfig, FakeBackend, FakeModel, Request
from llamapy.engine.request import ErrorEvent, Run
from llamapy.engine.slots import SlotPool
from llamapy.engine.testing import Recorder, drain
from llamapy.errors import EngineError, InvalidOptionError
from llamapy.options import resolve_request_options

NO_EOG = {"logit_bias": {0: -math.inf}}


class _ForeignSampler(FakeBackend):
    """Building the sampler of a request with seed 666 raises a foreign error (as cffi's
    ``OverflowError`` did for an int that did not fit C)."""

    def new_sampler(self, params: Any) -> Any:
        if params.seed == 666:
            raise OverflowError("int too big to convert")
        return super().new_sampler(params)


def _engine(n_parallel: int = 2) -> tuple[Engine, FakeBackend]:
    backend = _ForeignSampler(n_ctx=4096, n_seq_max=n_parallel, model=FakeModel(n_vocab=64))
    return Engine(backend, EngineConfig(n_parallel=n_parallel)), backend


def test_a_foreign_error_in_submit_is_an_engine_error_that_changes_nothing() -> None:
    engine, backend = _engine()
    with pytest.raises(EngineError, match="OverflowError"):
        engine.submit(Request("x", [1, 2], resolve_request_options({"seed": 666})))
    engine.check_integrity()
    assert not engine.runs and not engine.queue and not backend.open_samplers
    sink = Recorder()  # the id is free again, and the engine serves on
    engine.submit(Request("x", [1, 2], resolve_request_options({"max_tokens": 2, **NO_EOG}),
                          sink=sink))
    drain(engine, each=engine.check_integrity)
    assert sink.finish_reason == "max_tokens"


def _bad_token(request: Request) -> Request:
    return Request(request.request_id, [10**6], request.options, sampler=request.sampler)


def _unhashable_session(request: Request) -> Request:
    object.__setattr__(request.options, "session", ([1],))  # past the options' own check
    return request


@pytest.mark.parametrize(("refusal", "error"), [(_bad_token, InvalidOptionError),
                                                (_unhashable_session, EngineError)],
                         ids=["typed", "foreign"])
def test_a_sampler_built_ahead_is_closed_when_submit_refuses(
        refusal: Callable[[Request], Request], error: type[Exception]) -> None:
    """The runtime builds costly samplers ahead and hands them over with the request: when
    ``submit`` refuses it (a typed error, or a foreign one), that sampler is closed."""
    engine, backend = _engine()
    options = resolve_request_options({"max_tokens": 2})
    request = refusal(Request("a", [1, 2], options,
                              sampler=backend.new_sampler(options.sampling)))
    with pytest.raises(error):
        engine.submit(request)
    assert not backend.open_samplers and not engine.runs


def test_a_queued_run_whose_routing_raises_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot: "first" runs, "bad" and "next" wait. Once "first" is done and the slot is
    idle, routing "bad" raises (a bug, as hashing an unhashable session did): ``has_work``
    still answers, "bad" ends with ``EngineError`` and "next" runs."""
    engine, backend = _engine(n_parallel=1)
    sinks = {name: Recorder() for name in ("first", "bad", "next")}
    for name, sink in sinks.items():
        options = resolve_request_options({"max_tokens": 3, **NO_EOG})
        engine.submit(Request(name, [1, 2], options, sink=sink))
    assert [r.request_id for r in engine.queue] == ["bad", "next"]
    route = SlotPool.route

    def buggy_route(pool: SlotPool, run: Run) -> Any:
        if run.request_id == "bad" and pool.idle():
            raise RuntimeError("bug in routing")
        return route(pool, run)

    monkeypatch.setattr(SlotPool, "route", buggy_route)
    drain(engine, each=engine.check_integrity)
    assert isinstance(sinks["bad"].final, ErrorEvent)
    assert isinstance(sinks["bad"].final.exc, EngineError)
    assert sinks["first"].finish_reason == sinks["next"].finish_reason == "max_tokens"
    assert not engine.runs and not backend.open_samplers
