"""A model thread stuck in one tick (a native call that does not return) counts as dead:
``stall_timeout`` after the tick began, the loop is ``CRASHED``, ``/health`` is 503, every
request is refused and the crash hook runs once (the server process exits for a supervisor)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from starlette.testclient import TestClient
from test_runtime import request

from llamapy.engine import Engine, EngineConfig, FakeBackend, FakeModel
from llamapy.errors import RuntimeDiedError
from llamapy.runtime import Hosted, LoopState, RequestStream, TickLoop
from llamapy.runtime.stall import StallWatch
from llamapy.serve import create_app
from llamapy.server.fake import fake_server

WAIT_S = 10.0


class _StuckTick(Engine):
    """An engine whose tick blocks until ``release`` is set, once ``stick`` is set."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.stick, self.stuck, self.release = (threading.Event(), threading.Event(),
                                                threading.Event())

    def tick(self, keep_going: Callable[[], bool] = lambda: True) -> bool:
        if self.stick.is_set():
            self.stuck.set()
            self.release.wait(60)
        return super().tick(keep_going)


def _stuck_loop(stall_timeout: float) -> tuple[TickLoop, _StuckTick]:
    engine = _StuckTick(FakeBackend(n_ctx=4096, n_seq_max=2, model=FakeModel(n_vocab=128)),
                        EngineConfig(n_parallel=2))
    loop = TickLoop(lambda: Hosted(engine=engine), thread_name="test-stall",
                    stall_timeout=stall_timeout)
    assert loop.ready.wait(WAIT_S)
    return loop, engine


def test_a_stuck_tick_kills_the_loop_once_and_refuses_all_work() -> None:
    loop, engine = _stuck_loop(0.2)
    died: list[RuntimeDiedError] = []
    told = threading.Event()
    loop.on_crash.append(lambda error: (died.append(error), told.set()))
    try:
        assert len(list(RequestStream(loop, request([1, 2]), timeout=WAIT_S))) > 1  # served
        engine.stick.set()
        ended: list[BaseException] = []
        stream = RequestStream(loop, request([3, 4]), timeout=WAIT_S)
        thread = threading.Thread(target=_drain, args=(stream, ended), daemon=True)
        thread.start()
        assert told.wait(WAIT_S) and engine.stuck.is_set()
        assert loop.state is LoopState.CRASHED
        assert "stall_timeout" in str(died[0])
        late = RequestStream(loop, request([5, 6]), timeout=WAIT_S)
        try:
            list(late)
        except RuntimeDiedError:
            pass
        else:
            raise AssertionError("a request on a stalled loop was served")
    finally:
        engine.release.set()
    loop._thread.join(WAIT_S)
    thread.join(WAIT_S)
    assert not loop.alive and loop.state is LoopState.CRASHED
    assert len(died) == 1  # the stall told once, not again when the thread ended
    assert len(ended) == 1  # the stuck request ended with an error, not silence


def _drain(stream: RequestStream, ended: list[BaseException]) -> None:
    try:
        list(stream)
    except Exception as exc:
        ended.append(exc)


def test_short_units_of_work_never_count_as_a_stall() -> None:
    fired = threading.Event()
    watch = StallWatch(1.0, lambda _: fired.set())
    try:
        for _ in range(200):
            watch.begin()
            watch.end()
        assert not fired.wait(1.5)  # past the bound, idle: nothing fires
        watch.begin()  # a unit that does not end
        assert fired.wait(WAIT_S)
    finally:
        watch.close()


def test_health_is_503_once_the_model_thread_is_stuck() -> None:
    """On the fake backend a decode that sleeps past ``stall_timeout`` is a stuck tick."""
    server = fake_server(sleep_s=3.0, stall_timeout=0.3, n_ctx=512, n_parallel=1)
    app = create_app(server, alias="fake", embeddings=False, own_server=True)
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as client:
        server.wait_ready(WAIT_S)
        assert client.get("/health").status_code == 200
        worker = threading.Thread(target=lambda: client.post(
            "/completion", json={"prompt": "hi", "n_predict": 2}), daemon=True)
        worker.start()
        deadline = time.monotonic() + WAIT_S
        while server.runtime.state is not LoopState.CRASHED and time.monotonic() < deadline:
            time.sleep(0.01)
        response = client.get("/health")
        assert response.status_code == 503, response.text
        assert "stall_timeout" in response.text
        worker.join(WAIT_S)


def test_a_long_unit_whose_progress_moves_is_no_stall() -> None:
    """A decode that takes longer than the bound but keeps computing (the heartbeat count
    moves) is left alone; once the count stops, the unit is stuck."""
    fired = threading.Event()
    count, ticking = [0], threading.Event()
    ticking.set()

    def beat() -> None:
        while ticking.is_set():
            count[0] += 1
            time.sleep(0.01)

    watch = StallWatch(0.2, lambda _: fired.set(), progress=lambda: count[0])
    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        watch.begin()  # one unit, 5 bounds long, computing all along
        assert not fired.wait(1.0)
        ticking.clear()  # the computation stops: stuck
        assert fired.wait(WAIT_S)
    finally:
        ticking.clear()
        watch.close()
