"""The runtime (tick thread and inline) and the one event client, on the fake backend."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

from llamapy.engine import (
    DecodeMaximal,
    DoneEvent,
    Engine,
    EngineConfig,
    FakeBackend,
    FakeModel,
    Request,
    RequestOptions,
    SamplingParams,
    TokenEvent,
)
from llamapy.engine.request import CacheKey
from llamapy.errors import (
    CancelledError,
    ClosedError,
    EngineError,
    LeaseTimeoutError,
    LoadFailedError,
    QueueFullError,
    RequestTimeoutError,
    TenantBusyError,
)
from llamapy.runtime import (
    AsyncRequestStream,
    Collector,
    Hosted,
    InlineRuntime,
    LoopState,
    RequestStream,
    TickLoop,
    new_request_id,
)

SAMPLING = SamplingParams(seed=3, temp=0.8, logit_bias={0: float("-inf")})  # no EOG


def fake_engine(n_parallel: int = 2, *, sleep_s: float = 0.0, **config: object) -> Engine:
    backend = FakeBackend(n_ctx=40_000, n_seq_max=n_parallel, model=FakeModel(n_vocab=128),
                          sleep_s=sleep_s)
    cfg = EngineConfig(n_parallel=n_parallel, sampling=SAMPLING, **config)  # type: ignore[arg-type]
    return Engine(backend, cfg)


def request(prompt: list[int], max_tokens: int = 8, **options: object) -> Request:
    opts = RequestOptions(max_tokens=max_tokens, sampling=SAMPLING, **options)  # type: ignore[arg-type]
    return Request(new_request_id(), prompt, opts)


def reference(prompt: list[int], n: int) -> list[int]:
    return FakeModel(n_vocab=128).reference(prompt, n, SAMPLING)


def counters(runtime: TickLoop | InlineRuntime) -> dict:
    return runtime.call(lambda engine: engine.stats().as_dict())


def test_a_stream_yields_tokens_then_the_final_event(loop: TickLoop) -> None:
    events = list(RequestStream(loop, request([5, 6, 7], 6), timeout=5))
    assert [e.token_id for e in events if isinstance(e, TokenEvent)] == reference([5, 6, 7], 6)
    assert isinstance(events[-1], DoneEvent) and events[-1].finish_reason == "max_tokens"


def test_collector_builds_the_completion(loop: TickLoop) -> None:
    collector = Collector(3)
    done = None
    for event in RequestStream(loop, request([5, 6, 7], 4), timeout=5, per_event=False):
        done = collector.add(event) or done
    assert done is not None and done.token_ids == tuple(reference([5, 6, 7], 4))
    assert done.usage.prompt_tokens == 3 and done.completion_tokens == 4


def test_cancel_by_id_from_another_thread_frees_the_slot(loop: TickLoop) -> None:
    before = counters(loop)["num_cancelled"]
    stream = RequestStream(loop, request([1, 2, 3], 30_000), timeout=5)
    next(stream)
    threading.Thread(target=loop.cancel, args=(stream.request_id,)).start()
    with pytest.raises(CancelledError):
        for _ in stream:
            pass
    stats = counters(loop)
    assert stats["num_cancelled"] - before == 1 and stats["slots_active"] == 0


def test_a_garbage_collected_stream_is_cancelled(loop: TickLoop) -> None:
    before = counters(loop)["num_cancelled"]
    stream = RequestStream(loop, request([1, 2, 3], 30_000), timeout=5)
    next(stream)
    del stream
    gc.collect()
    wait_for(lambda: counters(loop)["num_cancelled"] - before == 1)
    assert counters(loop)["slots_active"] == 0


def test_an_abandoned_stream_is_cancelled_once_its_buffer_is_full(loop: TickLoop) -> None:
    """A consumer that stops reading (but keeps the stream) does not generate to max_tokens
    into an unbounded buffer: past MAX_BUFFERED_EVENTS unread events the request is cancelled."""
    stream = RequestStream(loop, request([1, 2, 3], 30_000), timeout=5)
    next(stream)  # then never read again
    wait_for(lambda: counters(loop)["slots_active"] == 0, timeout=30)
    stats = counters(loop)
    assert stats["num_cancelled"] >= 1
    assert 4096 <= stats["num_generated_tokens"] < 5000
    del stream


def test_a_per_event_timeout_cancels_the_request() -> None:
    runtime = TickLoop(lambda: Hosted(engine=fake_engine(sleep_s=0.05)))
    try:
        runtime.ready.wait(5)
        stream = RequestStream(runtime, request([1, 2], 100), timeout=0.01)
        with pytest.raises(RequestTimeoutError):
            list(stream)
        wait_for(lambda: counters(runtime)["slots_active"] == 0)
        assert counters(runtime)["num_cancelled"] == 1
    finally:
        runtime.close(5)


def test_errors_reach_the_stream_typed_and_the_loop_keeps_serving() -> None:
    engine = fake_engine(n_parallel=1, max_queue=1, sleep_s=0.005)
    runtime = TickLoop(lambda: Hosted(engine=engine))
    try:
        runtime.ready.wait(5)
        running = RequestStream(runtime, request([1], 30_000), timeout=5)
        next(running)
        queued = RequestStream(runtime, request([2], 3), timeout=5)
        with pytest.raises(QueueFullError):
            list(RequestStream(runtime, request([3], 3), timeout=5))
        running.cancel()
        assert len(list(queued)) == 4
        assert len(list(RequestStream(runtime, request([4, 4], 3), timeout=5))) == 4
    finally:
        runtime.close(5)


def test_a_tenant_over_its_bound_gets_its_429_and_other_tenants_are_served() -> None:
    engine = fake_engine(n_parallel=1, tenant_max_requests=1, sleep_s=0.005)
    runtime = TickLoop(lambda: Hosted(engine=engine))
    try:
        runtime.ready.wait(5)
        running = RequestStream(runtime, request([1], 30_000, tenant="a"), timeout=5)
        next(running)
        with pytest.raises(TenantBusyError):
            list(RequestStream(runtime, request([2], 3, tenant="a"), timeout=5))
        other = RequestStream(runtime, request([3], 3, tenant="b"), timeout=5)
        running.cancel()
        assert len(list(other)) == 4
    finally:
        runtime.close(5)


class _Broken(DecodeMaximal):
    name = "broken"

    def allocate(self, view):  # type: ignore[no-untyped-def]
        raise RuntimeError("strategy bug")


def test_a_broken_strategy_ends_requests_at_once_and_the_loop_stays_up() -> None:
    strategy = _Broken()
    runtime = TickLoop(lambda: Hosted(engine=fake_engine(batch_strategy=strategy)))
    try:
        runtime.ready.wait(5)
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(EngineError, match="strategy bug"):
                list(RequestStream(runtime, request([1, 2, 3], 5), timeout=5))
            assert time.monotonic() - started < 2.0
        assert counters(runtime)["slots_active"] == 0 and runtime.alive
    finally:
        runtime.close(5)


def test_async_streams_need_no_thread_per_request(loop: TickLoop) -> None:
    async def one(prompt: list[int]) -> list[int]:
        out = []
        async for event in AsyncRequestStream(loop, request(prompt, 5), timeout=5):
            if isinstance(event, TokenEvent):
                out.append(event.token_id)
        return out

    async def main() -> tuple[list[list[int]], int]:
        tasks = [asyncio.ensure_future(one([i, i + 1])) for i in range(1, 9)]
        await asyncio.sleep(0)
        threads = threading.active_count()
        return list(await asyncio.gather(*tasks)), threads

    before = threading.active_count()
    results, during = asyncio.run(main())
    assert during == before  # only this thread and the tick thread, however many streams
    assert results == [reference([i, i + 1], 5) for i in range(1, 9)]


def test_cancelling_the_awaiting_task_cancels_the_request(loop: TickLoop) -> None:
    async def main() -> None:
        stream = AsyncRequestStream(loop, request([1, 2], 30_000), timeout=5)

        async def read() -> None:
            async for _ in stream:
                pass

        task = asyncio.ensure_future(read())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    wait_for(lambda: counters(loop)["slots_active"] == 0)
    assert counters(loop)["num_cancelled"] == 1


def test_a_lease_waits_for_a_slot_without_polling() -> None:
    runtime = TickLoop(lambda: Hosted(engine=fake_engine(n_parallel=1)))
    try:
        runtime.ready.wait(5)
        first = runtime.lease(CacheKey(), timeout=1)
        with pytest.raises(LeaseTimeoutError):
            runtime.lease(CacheKey(), timeout=0.1)
        got: list[int] = []
        waiter = threading.Thread(target=lambda: got.append(runtime.lease(CacheKey(), 5)))
        waiter.start()
        time.sleep(0.1)
        runtime.release(first)
        waiter.join(5)
        assert got and got[0] != first
    finally:
        runtime.close(5)


def test_a_failed_build_answers_every_command_with_the_load_error() -> None:
    def build() -> Hosted:
        raise OSError("no such model")

    runtime = TickLoop(build)
    try:
        runtime.ready.wait(5)
        with pytest.raises(LoadFailedError, match="no such model"):
            runtime.call(lambda engine: 1)
        with pytest.raises(LoadFailedError):
            list(RequestStream(runtime, request([1], 2), timeout=5))
    finally:
        runtime.close(5)
    with pytest.raises(LoadFailedError):
        runtime.call(lambda engine: 1)


def test_closing_ends_streams_with_closed_error() -> None:
    runtime = TickLoop(lambda: Hosted(engine=fake_engine()))
    runtime.ready.wait(5)
    stream = RequestStream(runtime, request([1, 2], 30_000), timeout=5)
    next(stream)
    runtime.close(5)
    with pytest.raises(ClosedError):
        for _ in stream:
            pass
    with pytest.raises(ClosedError):
        runtime.call(lambda engine: 1)


def test_inline_runtime_gives_the_same_tokens_and_async_works() -> None:
    runtime = InlineRuntime(fake_engine())
    tokens = [e.token_id for e in RequestStream(runtime, request([9, 8], 5), timeout=5)
              if isinstance(e, TokenEvent)]
    assert tokens == reference([9, 8], 5)

    async def main() -> list[int]:
        return [e.token_id async for e in AsyncRequestStream(runtime, request([9, 8], 5), 5)
                if isinstance(e, TokenEvent)]

    assert asyncio.run(main()) == tokens


def wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_ticks_events_for_many_async_streams_cost_one_loop_wakeup() -> None:
    from llamapy.runtime.handles import AsyncHandle

    async def main() -> tuple[list[list[int]], int]:
        loop = asyncio.get_running_loop()
        wakeups = 0
        real = loop.call_soon_threadsafe

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal wakeups
            wakeups += 1
            return real(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        handles = [AsyncHandle(i, loop) for i in range(16)]

        def one_tick() -> None:  # the engine's thread delivering a tick's events
            for step in range(3):
                for h in handles:
                    h.sink(TokenEvent(h.request_id, step, "x"))

        thread = threading.Thread(target=one_tick)
        thread.start()
        thread.join()
        got = [[(await h.aget(1)).token_id for _ in range(3)] for h in handles]
        return got, wakeups

    got, wakeups = asyncio.run(main())
    assert got == [[0, 1, 2]] * 16
    assert wakeups == 1


def test_a_lease_idle_bound_past_what_a_thread_can_wait_leaves_the_loop_serving() -> None:
    """An idle bound of 1e10 s (past ``threading.TIMEOUT_MAX``) made the idle loop's inbox
    wait raise ``OverflowError``: the tick thread died. The wait is clamped."""
    runtime = TickLoop(lambda: Hosted(engine=fake_engine(n_parallel=2)))
    try:
        runtime.ready.wait(5)
        runtime.lease(CacheKey(), timeout=1, idle_s=1e10)
        time.sleep(0.1)  # the loop goes idle and waits for the lease's expiry
        assert runtime.alive and runtime.state is LoopState.READY
        assert len(list(RequestStream(runtime, request([1, 2]), timeout=5))) > 1
    finally:
        runtime.close(5)
