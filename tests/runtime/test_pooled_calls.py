"""``Server.score_tokens`` / ``pool_tokens`` on the fake backend with rank pooling: the
bounds a call meets, cancellation, bad inputs, and the order of a cancel and a submit.

The fake backend's pooled output is a hash of exactly the sequence it decoded
(:func:`~llamapy.engine.fake.model.fake_pooled`), so a wrong, mixed or chunked input shows.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable

import pytest

from llamapy.engine import Request, RequestOptions
from llamapy.engine.fake.model import fake_pooled, pooled_history
from llamapy.engine.request import ErrorEvent, RequestTimings
from llamapy.errors import (
    ClosedError,
    ContextOverflowError,
    InvalidOptionError,
    QueueFullError,
    RequestTimeoutError,
    TenantBusyError,
    UnsupportedFeatureError,
)
from llamapy.server.fake import fake_server
from llamapy.server.pooled import PooledBacklog, PooledCall


def _inputs(call: int, n: int) -> list[list[int]]:
    return [[1 + call, 2 + i % 7, 3 + i] for i in range(n)]


def _expected(inputs: list[list[int]]) -> list[tuple[float, ...]]:
    return [fake_pooled(pooled_history(ids)) for ids in inputs]


def _concurrent(server: object, calls: int, n: int, tenant: str | None = None) -> list[object]:
    """``calls`` pooled calls of ``n`` inputs each, made together; each one's outputs or
    error."""
    async def gather() -> list[object]:
        return list(await asyncio.gather(
            *(server.apool_tokens(_inputs(c, n), tenant=tenant)  # type: ignore[attr-defined]
              for c in range(calls)), return_exceptions=True))
    return asyncio.run(gather())


def test_calls_beyond_the_queue_wait_for_places_instead_of_failing_halfway() -> None:
    """Three calls of 8 inputs on 2 slots and a queue of 3: each call's first input finds a
    place, later ones refused for a full queue wait in the backlog; every call ends with its
    own outputs."""
    with fake_server(n_parallel=2, n_ctx=512, max_queue=3, pooling_type="rank",
                     sleep_s=0.002) as server:
        server.wait_ready(10)
        assert _concurrent(server, 3, 8) == [_expected(_inputs(c, 8)) for c in range(3)]
        stats = server.stats()
        assert stats["queue_depth"] == 0
        assert stats["num_rejected"] > 0  # (inputs were refused, waited, and went in later)


def test_a_call_refused_at_its_first_input_fails_at_once() -> None:
    with fake_server(n_parallel=1, n_ctx=512, max_queue=1, pooling_type="rank",
                     sleep_s=0.01) as server:
        server.wait_ready(10)
        results = _concurrent(server, 4, 4)
        assert any(isinstance(r, QueueFullError) for r in results)
        done = [(c, r) for c, r in enumerate(results) if isinstance(r, list)]
        assert done and all(r == _expected(_inputs(c, 4)) for c, r in done)


def test_a_call_s_window_is_no_wider_than_its_tenant_s_bound() -> None:
    """Four slots, two requests per tenant: a call keeps two inputs in the engine, so it
    never trips its own tenant's bound; a second call of the tenant made together is
    refused at its first input (the tenant is busy) or runs whole."""
    with fake_server(n_parallel=4, n_ctx=512, tenant_max_requests=2, pooling_type="rank",
                     sleep_s=0.002) as server:
        server.wait_ready(10)
        results = _concurrent(server, 2, 6, tenant="t")
        assert results[0] == _expected(_inputs(0, 6))
        assert isinstance(results[1], TenantBusyError) or results[1] == _expected(_inputs(1, 6))


def test_inputs_are_checked_before_any_is_submitted() -> None:
    with fake_server(n_parallel=2, n_ctx=512, n_ubatch=16, pooling_type="rank") as server:
        server.wait_ready(10)
        before = server.stats()["num_submitted"]
        with pytest.raises(InvalidOptionError):
            server.pool_tokens([[1, 2], [3, 4], 5])  # type: ignore[list-item]
        with pytest.raises(InvalidOptionError):
            server.pool_tokens([[1, 2], ["a"]])  # type: ignore[list-item]
        with pytest.raises(ContextOverflowError):  # one physical batch (16) at most
            server.pool_tokens([[1, 2], [3] * 17])
        assert server.stats()["num_submitted"] == before
        assert server.max_pooled_tokens == 16
        assert server.pool_tokens([[3] * 16, [4] * 16]) == _expected([[3] * 16, [4] * 16])
        with pytest.raises(UnsupportedFeatureError):
            server.complete_tokens([1, 2], max_tokens=2)


def test_a_timeout_cancels_what_is_in_flight() -> None:
    with fake_server(n_parallel=2, n_ctx=512, pooling_type="rank", sleep_s=0.01) as server:
        server.wait_ready(10)
        with pytest.raises(RequestTimeoutError):
            server.pool_tokens(_inputs(0, 50), timeout=0.05)
        assert server.pool_tokens(_inputs(1, 3)) == _expected(_inputs(1, 3))
        stats = server.stats()
        assert stats["queue_depth"] == 0 and stats["slots_active"] == 0


class _RacingLoop:
    """A stand-in for the tick loop whose ``submit`` lets a cancel of the call happen before
    it returns (as another thread may, between the two)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Hashable]] = []
        self.call: PooledCall | None = None

    def submit(self, request: Request) -> None:
        assert self.call is not None
        self.call.cancel()  # (the cancel's own loop.cancel finds the id not submitted yet)
        self.log.append(("submit", request.request_id))

    def cancel(self, request_id: Hashable) -> None:
        self.log.append(("cancel", request_id))


def test_a_cancel_that_overtakes_a_submit_is_sent_again_after_it() -> None:
    loop = _RacingLoop()
    ended = threading.Event()
    call = PooledCall(loop, [[1, 2]], 1, RequestOptions(max_tokens=0),  # type: ignore[arg-type]
                      PooledBacklog(), ended.set)
    loop.call = call
    call.start()
    rid = ("pooled", call._call, 0)
    assert loop.log[-2:] == [("submit", rid), ("cancel", rid)]
    assert ended.is_set() and call.error is not None


def test_a_tenant_bound_parks_a_later_input_and_the_call_ends_whole() -> None:
    """Window 2 (two slots) under a bound of 3 requests per tenant: a second call of the
    tenant gets its first input in, its second refused as the tenant's fourth, parked, and
    submitted again when an input ends."""
    with fake_server(n_parallel=2, n_ctx=512, tenant_max_requests=3, pooling_type="rank",
                     sleep_s=0.002) as server:
        server.wait_ready(10)
        assert _concurrent(server, 2, 6, "t") == [_expected(_inputs(c, 6)) for c in range(2)]
        assert server.stats()["num_rejected"] > 0


def test_empty_and_out_of_vocabulary_inputs_are_refused_before_any_is_submitted() -> None:
    with fake_server(n_parallel=2, n_ctx=512, pooling_type="rank") as server:
        server.wait_ready(10)
        before = server.stats()["num_submitted"]
        n_vocab = server.fetch_model().n_vocab
        for bad in ([[1, 2], []], [[1, 2], [-1]], [[1, 2], [n_vocab]]):
            with pytest.raises(InvalidOptionError):
                server.pool_tokens(bad)
        assert server.stats()["num_submitted"] == before


class _ClosedLoop:
    """A tick loop that has ended: every submit is answered at once with its end."""

    def submit(self, request: Request) -> None:
        request.sink(ErrorEvent(request.request_id, ClosedError("closed"), RequestTimings()))

    def cancel(self, request_id: Hashable) -> None:
        pass


def test_releasing_many_parked_inputs_into_a_closed_loop_ends_every_call() -> None:
    """Each release's submit is answered at once, whose sink releases again: the releases
    run one after another, not nested (3,000 would pass the recursion limit)."""
    backlog, loop, ended = PooledBacklog(), _ClosedLoop(), []
    calls = [PooledCall(loop, [[1], [2]], 1, RequestOptions(max_tokens=0),  # type: ignore[arg-type]
                        backlog, lambda: ended.append(1)) for _ in range(3000)]
    for call in calls:
        backlog.park(call, 1)
    backlog.release_one()
    assert len(ended) == 3000 and len(backlog) == 0
    assert all(isinstance(call.error, ClosedError) for call in calls)
