"""What a one-model app's lifecycle needs of ModelManager (``--sleep-idle-seconds`` is the
spec's ``keep_alive``): a read-only hold that keeps the model loaded without counting as a use,
the idle-unload hook that runs before the server closes (and that a hold waits for), starting a
load without waiting, waiting for a load to settle, and the stored failure."""

from __future__ import annotations

import threading
import time

from fake_servers import FakeFactory, spec

from llamapy.errors import LoadFailedError
from llamapy.server import ModelManager, ModelState

WAIT_S = 10.0


def wait_state(m: ModelManager, name: str, state: ModelState) -> None:
    end = time.monotonic() + WAIT_S
    while m.status_of(name).state is not state:
        assert time.monotonic() < end, f"{name} never became {state.value}"
        time.sleep(0.01)


def test_a_hold_keeps_the_model_loaded_without_being_a_use() -> None:
    factory, unloaded = FakeFactory(), threading.Event()
    held_during: list[int] = []  # the hook's view of the holds: never called under one

    def hook(name: str, server: object) -> None:
        held_during.append(m._entries[name].holds)  # the hook runs with the lock held
        unloaded.set()

    m = ModelManager([spec("a")], server_factory=factory, on_idle_unload=hook)
    try:
        m.load("a", timeout=WAIT_S)  # kept forever until the hold is taken
        last_used = m._entries["a"].last_used
        with m.hold("a") as server:
            assert server is factory.made[0]
            m.keep("a", 0.05)
            time.sleep(0.3)  # idle far past its keep_alive, but a read is under way
            assert m.status_of("a").state is ModelState.LOADED and not unloaded.is_set()
        assert unloaded.wait(WAIT_S) and held_during == [0]
        assert m._entries["a"].last_used == last_used  # the hold was no use: clock not reset
        wait_state(m, "a", ModelState.UNLOADED)
        with m.hold("a") as server:  # unloaded: nothing held, nothing loaded
            assert server is None
        assert factory.starts("a") == 1
    finally:
        m.close()


def test_a_hold_waits_for_an_idle_unload_under_way() -> None:
    factory = FakeFactory()
    started, release = threading.Event(), threading.Event()

    def hook(name: str, server: object) -> None:
        started.set()
        release.wait(WAIT_S)

    m = ModelManager([spec("a", keep_alive=0.01)], server_factory=factory, on_idle_unload=hook)
    seen: list[object] = []
    reader = threading.Thread(target=lambda: seen.append(m.hold("a").__enter__()))
    try:
        m.start("a")
        assert started.wait(WAIT_S)
        reader.start()
        reader.join(0.2)
        assert reader.is_alive()  # it would read a model being closed
        release.set()
        reader.join(WAIT_S)
        assert not reader.is_alive() and seen == [None]  # then it finds it unloaded
    finally:
        release.set()
        m.close()


def test_keep_alive_zero_with_a_hook_unloads_after_the_hook() -> None:
    factory, calls = FakeFactory(), []
    m = ModelManager([spec("a", keep_alive=0)], server_factory=factory,
                     on_idle_unload=lambda name, server: calls.append((name, server.closed)))
    try:
        with m.acquire("a", timeout=WAIT_S):
            pass
        wait_state(m, "a", ModelState.UNLOADED)
        assert calls == [("a", False)]  # the hook saw the server before it was closed
        end = time.monotonic() + WAIT_S
        while not factory.made[0].closed:
            assert time.monotonic() < end
            time.sleep(0.01)
    finally:
        m.close()


def test_a_failing_hook_still_unloads_the_model() -> None:
    def hook(name: str, server: object) -> None:
        raise RuntimeError("snapshot failed")

    m = ModelManager([spec("a", keep_alive=0.01)], server_factory=FakeFactory(),
                     on_idle_unload=hook)
    try:
        m.start("a")
        wait_state(m, "a", ModelState.UNLOADED)
    finally:
        m.close()


def test_start_loads_in_the_background_and_wait_settled_waits_for_it() -> None:
    factory = FakeFactory()
    gate = factory.hold("a")
    m = ModelManager([spec("a")], server_factory=factory)
    try:
        m.start("a")
        assert m.status_of("a").state is ModelState.LOADING
        assert m.wait_settled("a", 0.05).state is ModelState.LOADING
        gate.set()
        assert m.wait_settled("a", WAIT_S).state is ModelState.LOADED
        m.start("a")  # loaded: nothing to start
        assert factory.starts("a") == 1 and m.failure("a") is None
    finally:
        m.close()


def test_a_failed_load_is_kept_as_the_models_typed_error() -> None:
    factory = FakeFactory()
    factory.fail["a"] = LoadFailedError("no such file")
    m = ModelManager([spec("a")], server_factory=factory)
    try:
        m.start("a")
        assert m.wait_settled("a", WAIT_S).state is ModelState.FAILED
        error = m.failure("a")
        assert isinstance(error, LoadFailedError) and "no such file" in str(error)
        with m.hold("a") as server:
            assert server is None
    finally:
        m.close()


def test_a_lease_that_must_not_wait_is_none_while_the_lock_is_held() -> None:
    """An event loop's fast path: the manager busy (an unload running its hooks under the
    lock) answers None at once instead of blocking; free, it leases as ever."""
    m = ModelManager([spec("a")], server_factory=FakeFactory())
    first = m.acquire("a", 5)  # held throughout: the model stays loaded
    try:
        held, done = threading.Event(), threading.Event()

        def hold() -> None:
            with m._cond:
                held.set()
                done.wait(5)

        thread = threading.Thread(target=hold)
        thread.start()
        held.wait(5)
        assert m.try_acquire("a", blocking=False) is None
        done.set()
        thread.join(5)
        for _ in range(1000):  # (the reaper takes the lock for a moment now and then)
            lease = m.try_acquire("a", blocking=False)
            if lease is not None:
                break
            time.sleep(0.001)
        assert lease is not None
        lease.release()
    finally:
        first.release()
        m.close()
