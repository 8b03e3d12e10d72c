"""Deadlines, stalls, cancellation and progress of session prefills and decodes, on a real tick
thread over the fake backend (each decode call sleeps, so prefills take several ticks)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from session_fakes import fake_manifest, fake_tokenize

from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.options import EngineConfig, SamplingParams
from llamapy.errors import CancelledError, RequestTimeoutError
from llamapy.runtime import Hosted, TickLoop
from llamapy.session import InlineHost, PrefillProgress, Session, SessionConfig

TARGET = [2 + i % 60 for i in range(512)]  # 16 chunks of 32 tokens
SAMPLING = SamplingParams(seed=7, temp=0.8, logit_bias={0: float("-inf")})  # no EOG


@pytest.fixture
def loop_factory() -> Iterator[list[TickLoop]]:
    loops: list[TickLoop] = []
    yield loops
    for loop in loops:
        loop.close(5)


def threaded_session(loops: list[TickLoop], sleep_s: float,
                     request_timeout: float = 5.0) -> tuple[Session, Engine]:
    """A session on a tick thread whose every decode call takes ``sleep_s`` seconds."""
    backend = FakeBackend(n_ctx=2048, n_seq_max=1, n_batch=32, kv_unified=False,
                          sleep_s=sleep_s)
    engine = Engine(backend, EngineConfig(n_parallel=1, n_batch=32, chunk_size=32,
                                          kv_unified=False, sampling=SAMPLING))
    loop = TickLoop(lambda: Hosted(engine=engine))
    loops.append(loop)
    loop.ready.wait(5)
    host = InlineHost(engine, fake_manifest(), tokenize=fake_tokenize)
    host.runtime = loop  # type: ignore[assignment]  # the same session, on a real tick thread
    config = SessionConfig(lease_timeout=5, request_timeout=request_timeout)
    return Session(host, config), engine


def num_cancelled(loops: list[TickLoop]) -> object:
    return loops[-1].call(lambda engine: engine.stats().as_dict()["num_cancelled"])


def test_a_long_prefill_that_progresses_never_stalls(loop_factory: list[TickLoop]) -> None:
    s, _ = threaded_session(loop_factory, sleep_s=0.1, request_timeout=0.5)  # 16 ticks: 1.6 s
    seen: list[PrefillProgress] = []
    status = s.ensure_prefix(TARGET, on_progress=seen.append)
    assert status.prefilled_tokens == len(TARGET) and s.resident == TARGET
    done = [p.processed_tokens for p in seen]
    assert done == sorted(done) and len(seen) >= 16
    assert seen[-1] == PrefillProgress(len(TARGET), 0, len(TARGET))
    assert all(p.total_tokens == len(TARGET) for p in seen)


def test_a_deadline_rolls_ensure_prefix_back_and_a_retry_resumes(
        loop_factory: list[TickLoop]) -> None:
    s, _ = threaded_session(loop_factory, sleep_s=0.05)
    with pytest.raises(RequestTimeoutError, match="deadline"):
        s.ensure_prefix(TARGET, timeout=0.3)
    kept = s.resident
    assert 0 < len(kept) < len(TARGET) and kept == TARGET[:len(kept)]
    report = s.explain_context()
    assert not report.fatal and report.prefix_tokens == len(kept) and report.suffix_tokens == 0
    assert num_cancelled(loop_factory) == 1
    retry = s.ensure_prefix(TARGET)
    assert retry.reused_tokens == len(kept) and retry.warm
    assert retry.prefilled_tokens == len(TARGET) - len(kept) and s.resident == TARGET
    s.close()


def test_a_deadline_rolls_prefill_suffix_back_to_the_stable_prefix(
        loop_factory: list[TickLoop]) -> None:
    s, _ = threaded_session(loop_factory, sleep_s=0.05)
    s.ensure_prefix(TARGET[:64])
    suffix = TARGET[64:]
    with pytest.raises(RequestTimeoutError):
        s.prefill_suffix(suffix, timeout=0.3)
    report = s.explain_context()
    assert report.prefix_tokens == 64 and 0 < report.suffix_tokens < len(suffix)
    assert s.resident == TARGET[:64 + report.suffix_tokens]
    retry = s.prefill_suffix(suffix)
    assert retry.reused_tokens == report.suffix_tokens and s.resident == TARGET
    s.close()


def test_cancel_from_another_thread_stops_the_prefill(loop_factory: list[TickLoop]) -> None:
    s, _ = threaded_session(loop_factory, sleep_s=0.05)
    started = threading.Event()
    threading.Thread(target=lambda: (started.wait(5), s.cancel()), daemon=True).start()
    with pytest.raises(CancelledError):
        s.ensure_prefix(TARGET, on_progress=lambda p: p.processed_tokens and started.set())
    kept = s.resident
    assert len(kept) < len(TARGET) and kept == TARGET[:len(kept)]
    s.cancel()  # nothing in flight: a no-op
    assert s.ensure_prefix(TARGET).reused_tokens == len(kept)
    s.close()


def test_an_exception_from_on_progress_cancels_and_propagates(
        loop_factory: list[TickLoop]) -> None:
    s, _ = threaded_session(loop_factory, sleep_s=0.02)

    def stop(progress: PrefillProgress) -> None:
        if progress.processed_tokens >= 96:
            raise KeyError("enough")

    with pytest.raises(KeyError, match="enough"):
        s.ensure_prefix(TARGET, on_progress=stop)
    kept = s.resident
    assert 96 <= len(kept) < len(TARGET) and kept == TARGET[:len(kept)]
    assert num_cancelled(loop_factory) == 1
    assert s.ensure_prefix(TARGET).reused_tokens == len(kept)
    s.close()


def test_cancelling_the_task_of_aensure_prefix_rolls_back(loop_factory: list[TickLoop]) -> None:
    s, _ = threaded_session(loop_factory, sleep_s=0.05)

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.create_task(s.aensure_prefix(
            TARGET, on_progress=lambda p: p.processed_tokens and started.set()))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        kept = s.resident
        assert 0 < len(kept) < len(TARGET) and kept == TARGET[:len(kept)]
        with pytest.raises(RequestTimeoutError):
            await s.aensure_prefix(TARGET, timeout=0.2)
        status = await s.aensure_prefix(TARGET)
        assert status.reused_tokens > len(kept) and s.resident == TARGET

    asyncio.run(main())
    s.close()


def test_a_decode_deadline_and_cancel_end_the_stream_not_the_session(
        loop_factory: list[TickLoop]) -> None:
    s, _ = threaded_session(loop_factory, sleep_s=0.02)
    s.ensure_prefix(TARGET[:8])
    chunks = list(s.decode(max_tokens=500, timeout=0.3))
    assert isinstance(chunks[-1].error, RequestTimeoutError)
    generated = s.explain_context().generated_tokens
    assert 0 < generated < 500
    stream = s.decode(max_tokens=500)
    with stream:
        next(stream)
        threading.Thread(target=s.cancel).start()
        rest = list(stream)
    assert isinstance(rest[-1].error, CancelledError) and rest[-1].finish_reason == "cancelled"
    assert s.explain_context().generated_tokens > generated
    assert s.prefill_suffix([5, 6]).suffix_tokens == 2
    s.close()
