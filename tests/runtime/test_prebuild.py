"""Costly samplers (a grammar, DRY) are built off the tick thread: other requests keep
decoding meanwhile, a cancel during the build still ends the request once, errors are typed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from test_runtime import SAMPLING, request

from llamapy.engine import Engine, EngineConfig, FakeBackend, FakeModel, Request, TokenEvent
from llamapy.errors import GrammarError, LoadFailedError, QueueFullError
from llamapy.runtime import Hosted, RequestStream, TickLoop

GRAMMAR = 'root ::= "x"'


class _SlowGrammar(FakeBackend):
    """Building a grammar's sampler takes ``build_s`` seconds (as a large one does)."""

    build_s = 1.0

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.built_on: list[str] = []

    def new_sampler(self, params: Any) -> Any:
        if params.grammar:
            self.built_on.append(threading.current_thread().name)
            time.sleep(self.build_s)
        return super().new_sampler(params)


@pytest.fixture
def setup() -> Iterator[tuple[TickLoop, _SlowGrammar]]:
    backend = _SlowGrammar(n_ctx=40_000, n_seq_max=2, model=FakeModel(n_vocab=128),
                           sleep_s=0.002)
    runtime = TickLoop(lambda: Hosted(engine=Engine(backend, EngineConfig(n_parallel=2))),
                       thread_name="test-tick")
    runtime.ready.wait(5)
    yield runtime, backend
    runtime.close(5)
    assert not backend.open_samplers


def grammar_request(prompt: list[int], max_tokens: int = 4) -> Request:
    req = request(prompt, max_tokens)
    return replace(req, options=replace(req.options,
                                        sampling=replace(SAMPLING, grammar=GRAMMAR)))


def test_other_requests_decode_while_a_grammar_is_built(setup: tuple[TickLoop, Any]) -> None:
    runtime, backend = setup
    other = RequestStream(runtime, request([5], 30_000), timeout=5)
    next(other)
    slow = RequestStream(runtime, grammar_request([1, 2]), timeout=5)
    counted, deadline = 0, time.monotonic() + backend.build_s * 0.8
    while time.monotonic() < deadline:  # during the build, the tick thread serves `other`
        counted += isinstance(next(other), TokenEvent)
    assert counted > 10
    assert len(list(slow)) == 5
    assert backend.built_on == ["llamapy-sampler_0"]
    other.cancel()


def test_a_cancel_during_the_build_ends_the_request_once(setup: tuple[TickLoop, Any]) -> None:
    """The cancel overtakes the request (it is still being built): the engine admits it
    when it arrives and cancels it at once, its sampler closed."""
    runtime, backend = setup
    stream = RequestStream(runtime, grammar_request([1, 2], 50), timeout=5)
    time.sleep(0.05)
    stream.cancel()
    deadline = time.monotonic() + 5
    while True:
        stats = runtime.call(lambda engine: engine.stats().as_dict())
        if stats["finish_reasons"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert stats["finish_reasons"] == {"cancelled": 1} and stats["slots_active"] == 0
    assert not backend.open_samplers


def test_a_bad_grammar_is_a_typed_error_from_the_builder(setup: tuple[TickLoop, Any]) -> None:
    runtime, _ = setup
    req = request([1, 2])
    bad = replace(req, options=replace(req.options, sampling=replace(SAMPLING,
                                                                     grammar="x ::= y")))
    with pytest.raises(GrammarError):
        list(RequestStream(runtime, bad, timeout=5))
    assert runtime.alive


def test_closing_while_building_ends_every_request(setup: tuple[TickLoop, Any]) -> None:
    runtime, _ = setup
    streams = [RequestStream(runtime, grammar_request([i + 1]), timeout=5) for i in range(3)]
    runtime.close(10)
    for stream in streams:
        with pytest.raises(Exception):  # noqa: B017 - ClosedError or CancelledError, typed
            list(stream)


class _HeldGrammar(FakeBackend):
    """Building a grammar's sampler waits for ``release`` (a build of known length)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.release = threading.Event()
        self.started = threading.Event()
        self.built = 0

    def new_sampler(self, params: Any) -> Any:
        if params.grammar:
            self.started.set()
            assert self.release.wait(10)
            self.built += 1
        return super().new_sampler(params)


def _held(max_queue: int) -> tuple[TickLoop, _HeldGrammar]:
    backend = _HeldGrammar(n_ctx=4096, n_seq_max=1, model=FakeModel(n_vocab=128))
    engine = Engine(backend, EngineConfig(n_parallel=1, max_queue=max_queue))
    runtime = TickLoop(lambda: Hosted(engine=engine))
    runtime.ready.wait(5)
    return runtime, backend


def test_a_request_cancelled_while_waiting_for_its_build_is_never_built() -> None:
    runtime, backend = _held(max_queue=8)
    try:
        first = RequestStream(runtime, grammar_request([1]), timeout=5)
        assert backend.started.wait(5)  # the builder is busy with `first`
        waiting = grammar_request([2])
        events: list[Any] = []
        waiting.sink = events.append
        runtime.submit(waiting)
        runtime.cancel(waiting.request_id)
        backend.release.set()
        assert len(list(first)) == 5
        assert backend.built == 1 and [e.finish_reason for e in events] == ["cancelled"]
    finally:
        runtime.close(5)


def test_requests_waiting_for_a_build_count_against_max_queue() -> None:
    runtime, backend = _held(max_queue=2)
    try:
        streams = [RequestStream(runtime, grammar_request([i + 1]), timeout=5) for i in range(2)]
        assert backend.started.wait(5)
        with pytest.raises(QueueFullError):  # at once, not after the two builds
            list(RequestStream(runtime, grammar_request([9]), timeout=5))
        backend.release.set()
        assert all(len(list(s)) == 5 for s in streams)
    finally:
        runtime.close(5)


def test_a_grammar_sent_while_the_model_loads_is_built_off_the_tick_thread() -> None:
    """Requests that come during the load (a server's first ones) wait for it on the builder
    thread, not on the tick thread; a failed load is their error."""
    loaded = threading.Event()
    backend = _SlowGrammar(n_ctx=4096, n_seq_max=1, model=FakeModel(n_vocab=128))
    backend.build_s = 0.0

    def build() -> Hosted:
        assert loaded.wait(5)
        return Hosted(engine=Engine(backend, EngineConfig(n_parallel=1)))

    runtime = TickLoop(build, thread_name="test-tick")
    try:
        stream = RequestStream(runtime, grammar_request([1, 2]), timeout=5)
        loaded.set()
        assert len(list(stream)) == 5 and backend.built_on == ["llamapy-sampler_0"]
    finally:
        runtime.close(5)

    def fail() -> Hosted:
        raise OSError("no such model")

    failed = TickLoop(fail)
    try:
        stream = RequestStream(failed, grammar_request([1, 2]), timeout=5)
        with pytest.raises(LoadFailedError):
            list(stream)
    finally:
        failed.close(5)
