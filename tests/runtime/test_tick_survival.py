"""Nothing a request sends ends the tick thread; a thread that dies anyway says so.

Each test drives a real :class:`TickLoop` on the fake backend with a request or a bug that
used to end the loop (a foreign exception out of ``Engine.submit``, a lease or a tick).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from test_runtime import SAMPLING, request

from llamapy.engine import Engine, EngineConfig, FakeBackend, FakeModel, Request
from llamapy.engine.request import CacheKey
from llamapy.engine.testing import CrashingEngine
from llamapy.errors import ClosedError, EngineError, InvalidOptionError, RuntimeDiedError
from llamapy.runtime import Hosted, LoopState, RequestStream, TickLoop, new_request_id


def _free(runtime: TickLoop) -> dict[str, Any]:
    stats = runtime.call(lambda engine: engine.stats().as_dict())
    runtime.call(lambda engine: engine.check_integrity())
    return stats


def test_an_unhashable_session_built_past_the_options_check_fails_alone(loop: TickLoop) -> None:
    """The `session: [[1]]` request of the issue, forced past the options' own check (as a
    caller building a Request by hand could): the engine answers a typed error and serves on."""
    bad = request([1, 2, 3])
    object.__setattr__(bad.options, "session", ([1],))
    with pytest.raises(EngineError, match="unhashable"):
        list(RequestStream(loop, bad, timeout=5))
    assert loop.alive and loop.state is LoopState.READY
    assert len(list(RequestStream(loop, request([4, 5]), timeout=5))) == 9
    assert _free(loop)["slots_active"] == 0


def test_an_unhashable_request_id_is_a_typed_error(loop: TickLoop) -> None:
    bad = Request([1], [1, 2], request([1]).options)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="request id"):
        list(RequestStream(loop, bad, timeout=5))
    assert loop.alive


class _SamplerBomb(FakeBackend):
    """A backend whose sampler construction raises a foreign error (as cffi's OverflowError
    did for an int that did not fit C)."""

    def new_sampler(self, params: Any) -> Any:
        if params.seed == 666:
            raise OverflowError("int too big to convert")
        return super().new_sampler(params)


def test_a_foreign_error_while_admitting_fails_that_request_only() -> None:
    backend = _SamplerBomb(n_ctx=4096, n_seq_max=2, model=FakeModel(n_vocab=128))
    runtime = TickLoop(lambda: Hosted(engine=Engine(backend, EngineConfig(n_parallel=2))))
    try:
        runtime.ready.wait(5)
        long = RequestStream(runtime, request([7], 200), timeout=5)
        next(long)
        from dataclasses import replace

        bomb = request([1, 2])
        object.__setattr__(bomb, "options", replace(bomb.options,
                                                    sampling=replace(SAMPLING, seed=666)))
        with pytest.raises(EngineError, match="OverflowError"):
            list(RequestStream(runtime, bomb, timeout=5))
        assert len(list(long)) == 200  # the other request ran on, untouched
        stats = _free(runtime)
        assert stats["slots_active"] == 0 and stats["queue_depth"] == 0
    finally:
        runtime.close(5)


class _LeaseBug(Engine):
    def lease(self, *key: Any, **bound: Any) -> int | None:
        if key and key[0] == "bug":
            raise ValueError("bug in lease")
        return super().lease(*key, **bound)


def test_a_lease_that_raises_a_foreign_error_fails_only_that_lease() -> None:
    engine = _LeaseBug(FakeBackend(n_ctx=4096, n_seq_max=2, model=FakeModel(n_vocab=128)),
                       EngineConfig(n_parallel=2, sampling=SAMPLING))
    runtime = TickLoop(lambda: Hosted(engine=engine))
    try:
        runtime.ready.wait(5)
        with pytest.raises(ValueError, match="bug in lease"):
            runtime.lease(CacheKey("bug"), timeout=1)
        assert runtime.alive and len(list(RequestStream(runtime, request([3]), timeout=5))) == 9
    finally:
        runtime.close(5)



def test_a_dead_loop_is_crashed_says_why_and_calls_on_crash() -> None:
    engine = CrashingEngine(FakeBackend(n_ctx=4096, n_seq_max=2, model=FakeModel(n_vocab=128)),
                      EngineConfig(n_parallel=2))
    runtime = TickLoop(lambda: Hosted(engine=engine))
    crashed = threading.Event()
    seen: list[RuntimeDiedError] = []
    runtime.on_crash.append(lambda error: (seen.append(error), crashed.set()))
    runtime.ready.wait(5)
    engine.armed = True
    stream = RequestStream(runtime, request([1, 2]), timeout=5)
    assert crashed.wait(5)
    with pytest.raises(ClosedError):  # the in-flight request ends, closed with the engine
        list(stream)
    assert runtime.state is LoopState.CRASHED and not runtime.alive
    assert "bug in tick" in str(seen[0]) and runtime.crash_error is seen[0]
    with pytest.raises(RuntimeDiedError):  # commands: at once, typed
        runtime.call(lambda e: None)
    with pytest.raises(RuntimeDiedError):  # a submit: at once, not after its timeout
        list(RequestStream(runtime, Request(new_request_id(), [1], request([1]).options),
                           timeout=30))


def test_the_serve_process_stops_with_status_70_when_its_loop_crashes(monkeypatch: Any) -> None:
    """``python -m llamapy.serve`` never stays up answering 503: a crash sends it SIGTERM
    (uvicorn's graceful stop), arms a forced exit, and ``main`` then returns 70."""
    from llamapy.serve import __main__ as serve_main

    signals: list[int] = []
    exits: list[float] = []
    monkeypatch.setattr(serve_main.os, "kill", lambda pid, sig: signals.append(sig))
    monkeypatch.setattr(serve_main, "_exit_later", exits.append)
    engine = CrashingEngine(FakeBackend(n_ctx=4096, n_seq_max=2, model=FakeModel(n_vocab=128)),
                      EngineConfig(n_parallel=2))
    runtime = TickLoop(lambda: Hosted(engine=engine))

    class _Served:
        pass

    served = _Served()
    served.runtime = runtime  # type: ignore[attr-defined]
    serve_main._watch(served)
    runtime.ready.wait(5)
    engine.armed = True
    runtime.submit(request([1, 2]))
    runtime._thread.join(5)
    try:
        import signal

        assert signals == [signal.SIGTERM] and exits == [serve_main.CRASH_EXIT_GRACE_S]
        assert serve_main._crashed.is_set() and serve_main.EXIT_CRASHED == 70
    finally:
        serve_main._crashed.clear()
