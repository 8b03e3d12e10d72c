"""The tick loop's own guards, each on its own: a command whose engine call raises a foreign
error fails only itself (the loop's catch, not the engine's); a cancel that overtakes a sampler
built ahead still cancels the request (forwarded after it, not just its sink going away); a
closed builder refuses at once."""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from typing import Any

import pytest
from test_runtime import request

from llamapy.engine import (
    DoneEvent,
    Engine,
    EngineConfig,
    FakeBackend,
    FakeModel,
    Request,
    RequestOptions,
)
from llamapy.engine.request import ErrorEvent
from llamapy.engine.testing import Recorder
from llamapy.errors import ClosedError, EngineError
from llamapy.options import resolve_request_options
from llamapy.runtime import Hosted, LoopState, RequestStream, TickLoop
from llamapy.runtime.prebuild import SamplerPrebuilder


class _CommandBugs(Engine):
    """An engine whose ``submit`` and ``cancel`` raise foreign errors past ``Engine``'s own
    wrapping (a bug in a subclass, or in a later change): only the loop can catch them."""

    def submit(self, request: Request) -> None:
        if request.request_id == "submit-bug":
            raise RuntimeError("bug in submit")
        super().submit(request)

    def cancel(self, request_id: Hashable) -> bool:
        if request_id == "cancel-bug":
            raise RuntimeError("bug in cancel")
        return super().cancel(request_id)


def test_a_command_that_raises_a_foreign_error_fails_only_itself() -> None:
    engine = _CommandBugs(FakeBackend(n_ctx=4096, n_seq_max=2, model=FakeModel(n_vocab=128)),
                          EngineConfig(n_parallel=2))
    runtime = TickLoop(lambda: Hosted(engine=engine), thread_name="test-command-bugs")
    try:
        assert runtime.ready.wait(5)
        runtime.cancel("cancel-bug")
        bad = request([1, 2])
        with pytest.raises(EngineError, match="bug in submit"):
            list(RequestStream(runtime, Request("submit-bug", bad.token_ids, bad.options),
                               timeout=5))
        assert len(list(RequestStream(runtime, request([3, 4]), timeout=5))) == 9
        assert runtime.alive and runtime.state is LoopState.READY
    finally:
        runtime.close(5)


class _GatedGrammar(FakeBackend):
    """Building a grammar's sampler waits until the test opens the gate."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.building = threading.Event()
        self.gate = threading.Event()

    def new_sampler(self, params: Any) -> Any:
        if params.grammar:
            self.building.set()
            assert self.gate.wait(10), "the test never opened the gate"
        return super().new_sampler(params)


def _grammar_options(max_tokens: int) -> RequestOptions:
    return resolve_request_options({"max_tokens": max_tokens, "grammar": 'root ::= "x"',
                                    "logit_bias": {0: -math.inf}})


def test_a_cancel_by_id_during_the_build_cancels_the_request() -> None:
    """``TickLoop.cancel(id)`` while the sampler is built, with a sink that stays interested
    (as a caller cancelling by id, not by dropping its stream): the request is admitted and
    cancelled at once, before any token; its sampler is closed."""
    backend = _GatedGrammar(n_ctx=4096, n_seq_max=2, model=FakeModel(n_vocab=128))
    runtime = TickLoop(lambda: Hosted(engine=Engine(backend, EngineConfig(n_parallel=2))),
                       thread_name="test-gated")
    done = threading.Event()
    sink = Recorder(on_event=lambda e: done.set() if isinstance(e, DoneEvent | ErrorEvent)
                    else None)
    try:
        assert runtime.ready.wait(5)
        runtime.submit(Request("g", [1, 2], _grammar_options(50), sink=sink))
        assert backend.building.wait(5)
        runtime.cancel("g")
        backend.gate.set()
        assert done.wait(10)
        assert sink.finish_reason == "cancelled" and sink.tokens == []
        assert runtime.call(lambda engine: not backend.open_samplers and not engine.runs)
    finally:
        backend.gate.set()
        runtime.close(5)


def test_a_closed_builder_refuses_at_once() -> None:
    """A request that reaches the builder once it is closed (the loop is shutting down) ends
    with ``ClosedError`` on the caller's thread; nothing is built or forwarded."""
    backend = FakeBackend(n_ctx=4096, n_seq_max=2, model=FakeModel(n_vocab=128))
    forwarded: list[Request] = []
    builder = SamplerPrebuilder(lambda: backend, lambda req, cancelled: forwarded.append(req))
    builder.close()
    sink = Recorder()
    builder.submit(Request("late", [1, 2], _grammar_options(4), sink=sink))
    assert isinstance(sink.final, ErrorEvent) and isinstance(sink.final.exc, ClosedError)
    assert not forwarded and not backend.open_samplers


class _ClosingInbox:
    """An inbox whose ``put`` lets the loop close right after it (as when a caller checked
    the state just before the tick thread's last drain, then put)."""

    def __init__(self, loop: TickLoop, inbox: Any) -> None:
        self.loop, self.inbox = loop, inbox

    def put(self, item: object) -> None:
        self.inbox.put(item)
        self.loop.state = LoopState.CLOSED

    def get_nowait(self) -> object:
        return self.inbox.get_nowait()


def test_a_command_put_as_the_loop_closes_is_answered() -> None:
    backend = FakeBackend(n_ctx=256, n_seq_max=1, model=FakeModel(n_vocab=64))
    runtime = TickLoop(lambda: Hosted(engine=Engine(backend, EngineConfig(n_parallel=1))),
                       thread_name="test-closing")
    runtime.ready.wait(5)
    runtime.close(5)
    runtime.state = LoopState.READY  # (the caller's check saw it still running)
    runtime._inbox = _ClosingInbox(runtime, runtime._inbox)  # type: ignore[assignment]
    sink = Recorder()
    runtime.submit(Request("late", [1, 2], RequestOptions(max_tokens=2), sink))
    assert isinstance(sink.final, ErrorEvent) and isinstance(sink.final.exc, ClosedError)


def test_a_submit_after_a_failed_load_was_closed_is_answered() -> None:
    def fail() -> Hosted:
        raise RuntimeError("no model")

    runtime = TickLoop(fail, thread_name="test-failed-closed")
    runtime.ready.wait(5)
    runtime.close(5)
    assert not runtime.alive and runtime.state is LoopState.FAILED
    sink = Recorder()
    runtime.submit(Request("late", [1, 2], RequestOptions(max_tokens=2), sink))
    assert isinstance(sink.final, ErrorEvent)
