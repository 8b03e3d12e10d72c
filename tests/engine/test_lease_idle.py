"""The idle bound of leases (:mod:`llamapy.engine.lease_idle`) on a fake clock: a lease is
reclaimed only once nothing has used it for its bound, never while a run is on it or queued
for it, and a use (a request, a KV operation) restarts its clock."""

from __future__ import annotations

import pytest
from engine_helpers import submit

from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.fake.model import FakeModel
from llamapy.engine.lease_idle import lease_expiry_wait, reclaim_idle_leases, release_if_held
from llamapy.engine.options import EngineConfig
from llamapy.engine.testing import drain
from llamapy.errors import UnknownLeaseError

PREFIX = list(range(1, 31))


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def clocked_engine(n_parallel: int = 1) -> tuple[Engine, Clock]:
    clock = Clock()
    backend = FakeBackend(n_ctx=1024 * n_parallel, n_seq_max=n_parallel,
                          model=FakeModel(n_vocab=512))
    return Engine(backend, EngineConfig(n_parallel=n_parallel), clock=clock), clock


def test_an_unused_lease_is_reclaimed_after_its_bound_and_its_holder_told() -> None:
    engine, clock = clocked_engine()
    told: list[str] = []
    lease = engine.lease("s", idle_s=10.0, on_expire=lambda: told.append("expired"))
    assert lease is not None and lease_expiry_wait(engine) == 10.0
    clock.now += 9.0
    assert reclaim_idle_leases(engine) == [] and told == []
    clock.now += 1.0
    assert reclaim_idle_leases(engine) == [lease] and told == ["expired"]
    assert engine.pool.leases == {} and lease_expiry_wait(engine) is None
    with pytest.raises(UnknownLeaseError):
        engine.leases.tokens(lease)
    release_if_held(engine, lease)  # a late release (a finalizer's) is ignored
    assert engine.lease("t") is not None  # the slot serves again


def test_a_use_restarts_the_clock() -> None:
    engine, clock = clocked_engine()
    lease = engine.lease("s", idle_s=10.0)
    clock.now += 9.0
    assert engine.leases.tokens(lease) == []  # a KV operation is a use
    clock.now += 9.0
    assert reclaim_idle_leases(engine) == [] and lease_expiry_wait(engine) == 1.0
    sink = submit(engine, "turn", PREFIX, max_tokens=2, cache_scope="s", lease_id=lease)
    clock.now += 5.0
    drain(engine)  # the request ends now: the bound counts from here
    assert sink.finish_reason in ("eog", "max_tokens")
    clock.now += 9.0
    assert reclaim_idle_leases(engine) == []
    clock.now += 1.0
    assert reclaim_idle_leases(engine) == [lease]


def test_a_lease_is_never_reclaimed_while_a_run_is_on_it_or_queued_for_it() -> None:
    engine, clock = clocked_engine()
    lease = engine.lease("s", idle_s=1.0)
    sink = submit(engine, "long", PREFIX, max_tokens=50, cache_scope="s", lease_id=lease)
    engine.tick()
    clock.now += 60.0  # a run far longer than the bound
    assert reclaim_idle_leases(engine) == [] and sink.final is None
    drain(engine)
    assert sink.finish_reason in ("eog", "max_tokens")
    clock.now += 60.0
    queued = submit(engine, "queued", PREFIX, max_tokens=1, cache_scope="s", lease_id=lease)
    assert reclaim_idle_leases(engine) == []  # (submitted, not yet admitted)
    drain(engine)
    assert queued.finish_reason in ("eog", "max_tokens")


def test_a_lease_without_a_bound_is_kept_and_a_holder_bug_breaks_nothing() -> None:
    engine, clock = clocked_engine(n_parallel=2)
    kept = engine.lease("a")

    def bug() -> None:
        raise RuntimeError("holder bug")

    lost = engine.lease("b", idle_s=1.0, on_expire=bug)
    clock.now += 1e6
    assert reclaim_idle_leases(engine) == [lost]
    assert list(engine.pool.leases) == [kept] and lease_expiry_wait(engine) is None
