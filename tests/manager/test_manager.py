"""ModelManager rules on fake servers: on-demand loads, waiting, the budget (count and memory),
LRU eviction of idle models only, pinning, keep_alive, explicit load/unload, failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from fake_servers import FakeFactory, spec

from llamapy.errors import (
    ClosedError,
    IllegalTransitionError,
    InvalidOptionError,
    LoadFailedError,
    ModelBudgetError,
    ModelLoadError,
    NotReadyError,
    UnknownModelError,
    UnknownOptionError,
)
from llamapy.server import ModelManager, ModelSpec, ModelState
from llamapy.server.model_spec import check_transition


@pytest.fixture
def factory() -> FakeFactory:
    return FakeFactory()


def manager(factory: FakeFactory, *specs: ModelSpec, **kw: object) -> ModelManager:
    return ModelManager(specs, server_factory=factory, **kw)  # type: ignore[arg-type]


@pytest.fixture
def two(factory: FakeFactory) -> Iterator[ModelManager]:
    with manager(factory, spec("a", aliases=("alpha",)), spec("b")) as m:
        yield m


def states(m: ModelManager) -> dict[str, str]:
    return {s.name: s.state.value for s in m.status()}


def use(m: ModelManager, name: str) -> str:
    with m.acquire(name, timeout=5) as server:
        return str(server.use())


def wait_for(predicate: object, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


# --- names and loading ------------------------------------------------------------------------


def test_unknown_name_is_a_404_listing_the_served_models(two: ModelManager) -> None:
    with pytest.raises(UnknownModelError) as info:
        two.acquire("nope")
    assert info.value.http_status == 404
    assert info.value.served == ("a", "b")
    assert "a, b" in str(info.value)


def test_models_load_on_first_use_and_alternate(two: ModelManager, factory: FakeFactory) -> None:
    assert states(two) == {"a": "unloaded", "b": "unloaded"}
    for _ in range(3):
        assert use(two, "alpha") == "a"
        assert use(two, "b") == "b"
    assert states(two) == {"a": "loaded", "b": "loaded"}
    assert factory.starts("a") == factory.starts("b") == 1
    assert two.resolve("alpha") == "a"


def test_try_acquire_never_starts_a_load(two: ModelManager) -> None:
    assert two.try_acquire("a") is None
    assert two.status_of("a").state is ModelState.UNLOADED
    two.load("a")
    lease = two.try_acquire("alpha")
    assert lease is not None and lease.server.use() == "a"
    assert two.status_of("a").in_flight == 1
    lease.release()
    assert two.status_of("a").in_flight == 0


def test_peek_sees_a_loaded_server_without_using_it(two: ModelManager) -> None:
    assert two.peek("a") is None  # not loaded: nothing started
    assert two.status_of("a").state is ModelState.UNLOADED
    two.load("a")
    server = two.peek("alpha")
    assert server is not None and server.use() == "a"
    assert two.status_of("a").in_flight == 0  # no lease taken
    two.unload("a")
    assert two.peek("a") is None


def test_requesters_of_a_loading_model_wait_for_the_one_load(factory: FakeFactory) -> None:
    gate = factory.hold("a")
    with manager(factory, spec("a")) as m:
        results: list[str] = []
        threads = [threading.Thread(target=lambda: results.append(use(m, "a"))) for _ in range(3)]
        for t in threads:
            t.start()
        wait_for(lambda: m.status_of("a").in_flight == 3)
        assert m.status_of("a").state is ModelState.LOADING
        with pytest.raises(NotReadyError):
            m.acquire("a", timeout=0.05)
        gate.set()
        for t in threads:
            t.join(5)
        assert results == ["a", "a", "a"]
        assert factory.starts("a") == 1


def test_a_failed_load_is_typed_stored_and_touches_no_other_model(factory: FakeFactory) -> None:
    factory.fail["a"] = LoadFailedError(ModelLoadError("bad gguf"))
    with manager(factory, spec("a"), spec("b")) as m:
        for _ in range(2):
            with pytest.raises(LoadFailedError, match="bad gguf"):
                m.acquire("a", timeout=5)
        assert use(m, "b") == "b"
        status = m.status_of("a")
        assert status.state is ModelState.FAILED and "bad gguf" in (status.error or "")
        assert factory.starts("a") == 1  # requests do not retry a broken model
        del factory.fail["a"]
        assert m.load("a", timeout=5).state is ModelState.LOADED  # an explicit load retries


def test_a_foreign_factory_error_becomes_load_failed(factory: FakeFactory) -> None:
    factory.fail["a"] = OSError("disk")
    with manager(factory, spec("a")) as m, pytest.raises(LoadFailedError, match="disk"):
        m.acquire("a", timeout=5)


# --- the budget -------------------------------------------------------------------------------


def test_models_max_unloads_the_idle_model_and_the_next_request_reloads(
        factory: FakeFactory) -> None:
    with manager(factory, spec("a"), spec("b"), models_max=1) as m:
        use(m, "a")
        use(m, "b")
        assert states(m) == {"a": "unloaded", "b": "loaded"}
        assert ("close", "a") in factory.log
        use(m, "a")
        assert states(m) == {"a": "loaded", "b": "unloaded"}
        assert factory.starts("a") == 2


def test_eviction_takes_the_least_recently_used(factory: FakeFactory) -> None:
    with manager(factory, spec("a"), spec("b"), spec("c"), models_max=2) as m:
        use(m, "a")
        use(m, "b")
        use(m, "a")
        use(m, "c")
        assert states(m) == {"a": "loaded", "b": "unloaded", "c": "loaded"}


def test_memory_budget_evicts_until_the_model_fits(factory: FakeFactory) -> None:
    specs = (spec("a", 40), spec("b", 40), spec("big", 70), spec("huge", 200))
    with manager(factory, *specs, memory_mb=100) as m:
        use(m, "a")
        use(m, "b")
        assert states(m)["a"] == states(m)["b"] == "loaded"
        use(m, "big")
        assert states(m) == {"a": "unloaded", "b": "unloaded", "big": "loaded",
                             "huge": "unloaded"}
        with pytest.raises(ModelBudgetError):
            m.acquire("huge", timeout=5)  # larger than the whole budget: fails at once


def test_a_model_in_use_is_never_unloaded_under_its_request(factory: FakeFactory) -> None:
    with manager(factory, spec("a"), spec("b"), models_max=1) as m:
        lease = m.acquire("a")
        with pytest.raises(ModelBudgetError, match="in use"):
            m.acquire("b", timeout=0.05)
        got: list[str] = []
        waiter = threading.Thread(target=lambda: got.append(use(m, "b")))
        waiter.start()
        wait_for(lambda: m.status_of("b").in_flight == 1)
        assert lease.server.use() == "a"  # still serving while b waits for room
        lease.release()
        waiter.join(5)
        assert got == ["b"] and lease.server.closed


def test_pinned_models_are_not_evicted(factory: FakeFactory) -> None:
    with manager(factory, spec("a", pinned=True), spec("b"), spec("c"), models_max=2) as m:
        use(m, "a")
        use(m, "b")
        use(m, "c")  # a is least recently used, but pinned: b goes
        assert states(m) == {"a": "loaded", "b": "unloaded", "c": "loaded"}
        m.pin("c")
        with pytest.raises(ModelBudgetError, match="pinned"):
            m.acquire("b", timeout=5)  # the pinned models leave no room: fails at once
        m.pin("c", False)
        use(m, "b")
        assert states(m)["c"] == "unloaded"


def test_leases_of_many_threads_never_see_a_closed_server(factory: FakeFactory) -> None:
    names = ["a", "b", "c"]
    errors: list[BaseException] = []
    with manager(factory, *(spec(n) for n in names), models_max=2) as m:
        def worker(i: int) -> None:
            try:
                for j in range(30):
                    with m.acquire(names[(i + j) % 3], timeout=10) as server:
                        server.use()
                        time.sleep(0.001)
                        server.use()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert sum(s.state is ModelState.LOADED for s in m.status()) <= 2
        assert all(s.in_flight == 0 for s in m.status())


# --- keep_alive and explicit load/unload -------------------------------------------------------


def test_keep_alive_zero_unloads_when_the_last_request_ends(factory: FakeFactory) -> None:
    with manager(factory, spec("a", keep_alive=0)) as m:
        first, second = m.acquire("a"), m.acquire("a")
        first.release()
        first.release()  # idempotent
        assert m.status_of("a").state is ModelState.LOADED
        second.release()
        assert m.status_of("a").state is ModelState.UNLOADED
        assert m.load("a").state is ModelState.LOADED  # an explicit load is not a use


def test_keep_alive_duration_unloads_after_idle_time(factory: FakeFactory) -> None:
    with manager(factory, spec("a", keep_alive="1s"), spec("b"), keep_alive=-1) as m:
        use(m, "a")
        use(m, "b")
        assert m.status_of("a").state is ModelState.LOADED
        wait_for(lambda: m.status_of("a").state is ModelState.UNLOADED)
        assert m.status_of("b").state is ModelState.LOADED  # -1: kept
        lease = m.acquire("a")
        time.sleep(0.4)
        assert m.status_of("a").state is ModelState.LOADED  # held: the TTL does not run
        lease.release()
        wait_for(lambda: m.status_of("a").state is ModelState.UNLOADED)


def test_peeking_does_not_keep_a_model_alive(factory: FakeFactory) -> None:
    with manager(factory, spec("a", keep_alive="200ms")) as m:
        use(m, "a")

        def peeked_and_unloaded() -> bool:  # a live view watching it all along
            m.peek("a")
            return m.status_of("a").state is ModelState.UNLOADED

        wait_for(peeked_and_unloaded)


def test_explicit_unload_waits_for_the_request_in_flight(two: ModelManager) -> None:
    two.load("a")
    assert two.unload("a").state is ModelState.UNLOADED
    lease = two.acquire("b")
    assert two.unload("b").state is ModelState.LOADED
    assert lease.server.use() == "b"
    lease.release()
    assert two.status_of("b").state is ModelState.UNLOADED


def test_close_unloads_everything_and_refuses_later_calls(factory: FakeFactory) -> None:
    m = manager(factory, spec("a"), spec("b"))
    use(m, "a")
    m.close()
    m.close()
    assert ("close", "a") in factory.log
    with pytest.raises(ClosedError):
        m.acquire("a")


# --- specs and options ------------------------------------------------------------------------


def test_specs_validate_their_server_options_and_names(factory: FakeFactory) -> None:
    with pytest.raises(UnknownOptionError):
        ModelSpec(name="a", path="/m.gguf", options={"vocab_only": True})
    with pytest.raises(InvalidOptionError):
        ModelSpec(name="a", path="/m.gguf", options={"name": "x"})
    with pytest.raises(InvalidOptionError):
        ModelSpec(name="", path="/m.gguf")
    with pytest.raises(InvalidOptionError):
        ModelSpec(name="a", path="/m.gguf", keep_alive="soon")
    with pytest.raises(InvalidOptionError, match="already served"):
        manager(factory, spec("a"), spec("b", aliases=("a",)))
    with pytest.raises(InvalidOptionError):
        ModelManager(models_max=-1)


def test_memory_estimate_is_the_file_size(tmp_path: object, factory: FakeFactory) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "m.gguf"
    path.write_bytes(b"\0" * (3 << 20))
    with manager(factory, ModelSpec(name="m", path=path)) as m:
        assert m.status_of("m").memory_mb == pytest.approx(3.0)


def test_illegal_state_transitions_raise() -> None:
    with pytest.raises(IllegalTransitionError):
        check_transition(ModelState.UNLOADED, ModelState.LOADED)
    check_transition(ModelState.FAILED, ModelState.LOADING)


def test_status_as_dict_is_json_ready(two: ModelManager) -> None:
    use(two, "a")
    a, b = (s.as_dict() for s in two.status())
    assert a["state"] == "loaded" and a["aliases"] == ["alpha"] and a["keep_alive"] == -1
    assert b["state"] == "unloaded" and b["in_flight"] == 0


# --- per-request keep_alive (Ollama's) --------------------------------------------------------


def test_keep_sets_the_idle_ttl_and_none_restores_the_configured_one(factory: FakeFactory
                                                                     ) -> None:
    with manager(factory, spec("a", keep_alive="5m"), spec("b"), keep_alive=60) as m:
        assert m.keep("a", 10).keep_alive == 10 and m.keep("b", "-1").keep_alive == float("inf")
        assert m.keep("a", None).keep_alive == 300 and m.keep("b", None).keep_alive == 60
        use(m, "a")
        m.keep("a", 0)  # unloads when its last lease ends
        with m.acquire("a", timeout=5):
            assert states(m)["a"] == "loaded"
        wait_for(lambda: states(m)["a"] == "unloaded")
        with pytest.raises(InvalidOptionError):
            m.keep("a", "soon")
