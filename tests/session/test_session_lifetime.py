"""How a session's lease ends on a shared server (fake backend, one slot, a real tick thread):
an open its caller gave up on hands back what it leases, a session dropped without ``close()``
releases its slot when collected, an unused lease is reclaimed after its idle bound, and
``explain_context`` answers without the tick thread.

Every test is on a one-slot server, so a leaked lease would make the next request wait for
good: each ends with a request that must complete within a bounded wait."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from session_fakes import make_engine, open_fake

from llamapy.engine.engine import Engine
from llamapy.errors import InvalidOptionError, LeaseExpiredError, SessionClosedError
from llamapy.options import TIMEOUTS
from llamapy.server import Server
from llamapy.server.fake import fake_server
from llamapy.session import SessionConfig

CONFIG = SessionConfig(lease_timeout=30.0, request_timeout=10.0)
#: A request's bound: one that waits for a leaked slot fails with RequestTimeoutError.
REQUEST_TIMEOUT = 5.0


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A file for the fake model (the session's manifest digests the model file)."""
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"fake weights")
    return path


@pytest.fixture
def server(model_file: Path) -> Iterator[Server]:
    """A one-slot fake server whose decodes take a little time (streams can end early)."""
    with fake_server(str(model_file), n_parallel=1, n_ctx=512, sleep_s=0.005) as srv:
        srv.wait_ready(10)
        yield srv


def waiting_leases(server: Server) -> int:
    """Lease requests the tick thread holds, not yet granted."""
    return len(server.runtime._leases)


async def until(condition: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    """Wait (on the event loop) until ``condition()``; fail naming ``what`` past ``limit``."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.005)


def no_finalizer_release(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions opened from now on leave nothing to their finalizer: a lease handed back must
    be handed back by the code under test, not by the garbage collector."""
    monkeypatch.setattr(server.runtime, "release_later", lambda lease_id: None)


async def abandoned_open_then_request(server: Server,
                                      abandon: Callable[[], asyncio.Future[None]]) -> str:
    """Hold the slot, let ``abandon()`` start an open that waits for it and give it up, free
    the slot (the abandoned open's lease is granted), then run a request."""
    holder = await server.aopen_session(CONFIG)
    await abandon()
    await holder.aclose()
    await until(lambda: waiting_leases(server) == 0, "the abandoned open got the slot")
    done = await server.acomplete("after", max_tokens=3, timeout=REQUEST_TIMEOUT)
    return done.text


def test_a_cancelled_open_hands_back_the_slot_it_leases_later(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    no_finalizer_release(server, monkeypatch)

    def abandon() -> asyncio.Future[None]:
        task = asyncio.ensure_future(server.aopen_session(CONFIG))

        async def cancel() -> None:
            await until(lambda: waiting_leases(server) == 1, "the open waits for the slot")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        return asyncio.ensure_future(cancel())

    assert asyncio.run(abandoned_open_then_request(server, abandon))


def test_an_open_under_wait_for_that_times_out_hands_back_its_slot(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    no_finalizer_release(server, monkeypatch)

    def abandon() -> asyncio.Future[None]:
        async def timed_out() -> None:  # (the open waits for the slot meanwhile)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(server.aopen_session(CONFIG), 0.5)

        return asyncio.ensure_future(timed_out())

    assert asyncio.run(abandoned_open_then_request(server, abandon))


def test_a_session_dropped_without_close_frees_its_slot_when_collected(server: Server) -> None:
    session = server.open_session(CONFIG)
    session.ensure_prefix("a session nobody closes")
    collected = weakref.ref(session)
    del session
    gc.collect()
    assert collected() is None  # the finalizer keeps no reference to the session
    assert server.complete("after", max_tokens=3, timeout=REQUEST_TIMEOUT).text


def test_a_session_left_open_at_interpreter_exit_exits_cleanly(model_file: Path) -> None:
    script = (
        "from llamapy.server.fake import fake_server\n"
        f"server = fake_server({str(model_file)!r}, n_parallel=1, n_ctx=512)\n"
        "session = server.wait_ready(10).open_session()\n"
        "session.ensure_prefix('left open')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_an_unused_lease_is_reclaimed_and_the_session_says_so(server: Server) -> None:
    session = server.open_session(SessionConfig(lease_idle_timeout=0.2))
    session.ensure_prefix("a session left unused")
    assert server.complete("after", max_tokens=3, timeout=REQUEST_TIMEOUT).text
    with pytest.raises(LeaseExpiredError) as info:
        session.ensure_prefix("back again")
    assert isinstance(info.value, SessionClosedError)
    assert session.explain_context().closed
    session.close()  # quiet: nothing left to release


def test_explain_context_after_an_early_closed_stream_needs_no_tick_thread(
        server: Server) -> None:
    gate, entered, finished = threading.Event(), threading.Event(), threading.Event()

    def block(engine: Engine) -> None:  # holds the tick thread until the gate opens
        entered.set()
        gate.wait(10)
        finished.set()

    async def main() -> None:
        async with await server.aopen_session(CONFIG) as session:
            await session.aensure_prefix("tell me a long story")
            async with session.adecode(max_tokens=200) as stream:
                first = await stream.__anext__()
            assert first.error is None
            blocker = threading.Thread(target=server.call, args=(block, 30.0))
            blocker.start()
            await until(entered.is_set, "the tick thread is held")
            report = session.explain_context()  # on the event loop, the tick thread held
            assert not finished.is_set()  # answered while the tick thread was still held
            gate.set()
            await asyncio.to_thread(blocker.join, 30)
            assert not report.fatal and 1 <= report.generated_tokens < 200
            chunks = [chunk async for chunk in session.adecode(max_tokens=3)]
            assert all(c.error is None for c in chunks) and chunks[-1].finish_reason
            assert not session.explain_context().fatal

    asyncio.run(main())
    assert server.complete("after", max_tokens=3, timeout=REQUEST_TIMEOUT).text


def test_a_lease_with_no_idle_bound_is_never_reclaimed(server: Server) -> None:
    with server.open_session(SessionConfig(lease_idle_timeout=None)) as session:
        assert server.call(lambda engine: [s.lease_idle for s in engine.pool.slots]) == [None]
        session.ensure_prefix("kept")


def test_lease_idle_timeout_defaults_from_the_tree_and_is_checked() -> None:
    assert SessionConfig().lease_idle_timeout == TIMEOUTS.lease_idle
    for bad in (0, -1.0, "soon", float("nan")):
        with pytest.raises(InvalidOptionError, match="lease_idle_timeout"):
            SessionConfig(lease_idle_timeout=bad)  # type: ignore[arg-type]


def test_a_dropped_session_on_an_inline_runtime_frees_its_slot_at_the_next_lease() -> None:
    engine = make_engine(n_parallel=1)
    session = open_fake(engine)
    session.ensure_prefix((2, 3, 4))
    del session
    gc.collect()  # the finalizer runs; the release waits for the runtime's next lease
    with open_fake(engine) as again:
        assert again.ensure_prefix((2, 3, 4, 5)).reused_tokens == 3
    assert engine.pool.leases == {}
