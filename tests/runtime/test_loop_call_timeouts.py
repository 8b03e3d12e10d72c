"""A runtime call past its timeout never ran; one the tick thread took in time runs to its end.

``TickLoop.call`` / ``acall`` take a ``timeout`` for the wait: a call still in the inbox when
it passes is withdrawn (``TimeoutError``, ``fn`` never runs), while one the thread already
took is waited for and its result returned, so a caller that saw a timeout knows the engine
did not change behind its back (a session's restore relies on it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.options import EngineConfig
from llamapy.runtime import Hosted, TickLoop


@pytest.fixture
def loop() -> Iterator[TickLoop]:
    backend = FakeBackend(n_ctx=256, n_seq_max=1, n_batch=32, kv_unified=False)
    engine = Engine(backend, EngineConfig(n_parallel=1, n_batch=32, kv_unified=False))
    tick = TickLoop(lambda: Hosted(engine=engine))
    assert tick.ready.wait(5)
    yield tick
    tick.close(5)


def hold(gate: threading.Event, started: threading.Event,
         value: str) -> Callable[[Engine], str]:
    """An engine call that signals it runs, then waits on ``gate``."""
    def fn(engine: Engine) -> str:
        started.set()
        assert gate.wait(10)
        return value
    return fn


def open_later(gate: threading.Event, started: threading.Event, delay: float) -> None:
    """Open ``gate`` ``delay`` seconds after the held call started."""
    def run() -> None:
        assert started.wait(10)
        threading.Event().wait(delay)
        gate.set()
    threading.Thread(target=run, daemon=True).start()


def test_a_queued_call_past_its_timeout_never_runs(loop: TickLoop) -> None:
    gate, started, ran = threading.Event(), threading.Event(), []
    threading.Thread(target=loop.call, args=(hold(gate, started, "first"),), daemon=True).start()
    assert started.wait(5)  # the tick thread is busy in the first call
    with pytest.raises(TimeoutError):
        loop.call(lambda engine: ran.append("queued"), timeout=0.05)

    async def queued() -> None:
        with pytest.raises(TimeoutError):
            await loop.acall(lambda engine: ran.append("queued async"), timeout=0.05)

    asyncio.run(queued())
    gate.set()
    assert loop.call(lambda engine: "after", timeout=5) == "after"
    assert ran == []  # both withdrawn calls were skipped


def test_a_call_taken_in_time_returns_its_result_past_the_timeout(loop: TickLoop) -> None:
    gate, started = threading.Event(), threading.Event()
    open_later(gate, started, 0.8)
    assert loop.call(hold(gate, started, "sync"), timeout=0.4) == "sync"

    async def taken() -> str:
        gate2, started2 = threading.Event(), threading.Event()
        open_later(gate2, started2, 0.8)
        return await loop.acall(hold(gate2, started2, "async"), timeout=0.4)

    assert asyncio.run(taken()) == "async"
