"""Server calls on the fake backend: whole-call timeouts that bound the load, the async twins,
typed errors, finish reasons, option spellings and the package's exports."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from server_fixtures import gated_server

from llamapy.engine.fake.text import FakeTextModel
from llamapy.engine.request import FinishReason
from llamapy.errors import (
    CancelledError,
    InvalidOptionError,
    LoadFailedError,
    NotReadyError,
    NotRunningError,
    RequestCancelledError,
    RequestTimeoutError,
    UnknownOptionError,
)
from llamapy.server import Server
from llamapy.server.fake import fake_server


@pytest.fixture
def server() -> Iterator[Server]:
    with fake_server(n_parallel=2, n_ctx=1024) as s:
        s.wait_ready(10)
        yield s


@pytest.fixture
def slow() -> Iterator[Server]:
    """A server whose decodes take 5 ms each and whose model never ends a generation by itself
    (a request of 900 tokens runs for seconds)."""
    model = FakeTextModel("slow.gguf", eog_permille=0)
    with fake_server(n_parallel=2, n_ctx=1024, sleep_s=0.005, model=model) as s:
        s.wait_ready(10)
        yield s


def test_a_call_during_a_slow_load_raises_its_timeout(gate: threading.Event) -> None:
    with gated_server(gate) as server:
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError, match="load") as raised:
            server.generate("hello", max_tokens=2, timeout=0.3)
        assert isinstance(raised.value, TimeoutError)
        with pytest.raises(RequestTimeoutError):
            server.complete_tokens([1, 2, 3], max_tokens=2, timeout=0.1)
        with pytest.raises(RequestTimeoutError):
            server.tokenize("hello", timeout=0.1)
        assert time.monotonic() - started < 5.0
        gate.set()
        assert server.complete("hello", max_tokens=2).completion_tokens == 2
        assert server.tokenize("hi", timeout=5) == server.model.tokenize("hi", True, True)


def test_a_load_that_fails_while_a_call_waits_raises_load_failed(gate: threading.Event) -> None:
    with gated_server(gate, fail=True) as server:
        opener = threading.Timer(0.05, gate.set)
        opener.start()
        with pytest.raises(LoadFailedError):
            server.generate("hello", max_tokens=2, timeout=30)
        opener.join()


def test_async_calls_await_the_load_without_blocking_the_loop(gate: threading.Event) -> None:
    async def main(server: Server) -> str:
        late = asyncio.ensure_future(server.agenerate("hello", max_tokens=2, timeout=0.3))
        await asyncio.sleep(0)  # the call has run up to its first wait
        assert not late.done()  # a blocking wait would have ended it (with its timeout)
        with pytest.raises(RequestTimeoutError, match="load"):
            await late
        waiting = asyncio.ensure_future(server.agenerate("hello", max_tokens=2))
        await asyncio.sleep(0)
        assert not waiting.done()
        gate.set()  # the load ends: the waiting call wakes and generates
        return await waiting

    with gated_server(gate) as server:
        assert asyncio.run(main(server)) == server.generate("hello", max_tokens=2)


def test_cancelling_a_task_that_awaits_the_load_raises_asyncio_cancelled(
        gate: threading.Event) -> None:
    async def main(server: Server) -> None:
        task = asyncio.ensure_future(server.acomplete("hello", max_tokens=2))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with gated_server(gate) as server:
        asyncio.run(main(server))
        gate.set()
        server.wait_ready(10)
        assert server.stats()["num_submitted"] == 0


def test_agenerate_tokens_matches_generate_tokens(server: Server) -> None:
    ids = server.tokenize("count with me")
    text = asyncio.run(server.agenerate_tokens(ids, max_tokens=6, temp=0.0))
    assert text == server.generate_tokens(ids, max_tokens=6, temp=0.0)
    assert text


def test_fetch_model_raises_the_typed_reason_and_try_model_returns_none(
        gate: threading.Event) -> None:
    loading = gated_server(gate)
    with pytest.raises(NotReadyError):
        loading.fetch_model()
    assert loading.try_model() is None
    gate.set()
    loading.wait_ready(10)
    assert loading.try_model() is loading.fetch_model() is loading.model
    loading.close()
    with pytest.raises(NotRunningError):
        loading.fetch_model()
    assert loading.try_model() is None


def test_a_failed_load_is_raised_by_fetch_model() -> None:
    opened = threading.Event()
    opened.set()
    with gated_server(opened, fail=True) as failed:
        with pytest.raises(LoadFailedError):
            failed.wait_ready(10)
        with pytest.raises(LoadFailedError):
            failed.fetch_model()
        assert failed.try_model() is None


def test_a_cancelled_request_is_not_an_asyncio_cancellation(slow: Server) -> None:
    assert CancelledError is RequestCancelledError
    assert not issubclass(RequestCancelledError, asyncio.CancelledError)

    async def main() -> None:
        chunks = slow.astream("a long answer", max_tokens=900, request_id="doomed")
        async with chunks:
            await chunks.__anext__()
            slow.cancel("doomed")
            try:
                async for _ in chunks:
                    pass
            except asyncio.CancelledError:  # it must not be taken for the task's cancellation
                pytest.fail("a cancelled request raised asyncio.CancelledError")
            except RequestCancelledError:
                return
        pytest.fail("the cancelled request ended without an error")

    asyncio.run(main())


def test_cancelling_the_awaiting_task_propagates_asyncio_cancelled(slow: Server) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(slow.acomplete("hi", max_tokens=900))
        await asyncio.sleep(0)  # the task submits its request and awaits its events
        async for _ in slow.astream("hi", max_tokens=1):  # submitted after it: once this one
            pass  # is done, the engine has taken the task's request
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    stats = slow.stats()  # (the tick thread handles the cancel before this call)
    assert stats["num_cancelled"] == 1 and stats["num_finished"] == 2


def test_finish_reason_is_a_finish_reason(server: Server) -> None:
    done = server.complete("hello", max_tokens=3)
    assert isinstance(done.finish_reason, FinishReason)
    assert done.finish_reason is FinishReason.MAX_TOKENS and done.finish_reason == "max_tokens"
    assert f"{done.finish_reason}" == "max_tokens"
    assert server.complete("hello", max_tokens=0).finish_reason is FinishReason.PREFILL


def test_openai_spellings_are_accepted_once_per_option(server: Server) -> None:
    spelled = server.complete("hello", temperature=0.0, n_predict=5)
    assert spelled.completion_tokens == 5
    assert spelled.text == server.generate("hello", temp=0.0, max_tokens=5)
    with pytest.raises(InvalidOptionError, match="given twice") as raised:
        server.generate("hello", temp=0.1, temperature=0.2)
    assert not isinstance(raised.value, UnknownOptionError) and raised.value.option == "temp"
    with pytest.raises(InvalidOptionError, match="given twice"):
        server.stream("hello", max_tokens=2, max_completion_tokens=3)
    with pytest.raises(UnknownOptionError, match="temprature"):
        server.generate("hello", temprature=0.1)


def test_the_package_exports_the_public_api_lazily() -> None:
    from llamapy import (  # noqa: F401 - the import is the test
        Completion,
        DecodeConfig,
        FinishReason,
        ModelManager,
        PrefixInput,
        Server,
        Session,
        SessionConfig,
        SuffixInput,
        Usage,
        errors,
        open_standalone,
    )
    from llamapy.session import Session as SessionClass

    assert Session is SessionClass and errors.RequestCancelledError is RequestCancelledError
    code = ("import sys, llamapy\n"
            "print(' '.join(m for m in ('llamapy.engine', 'llamapy.server', 'llamapy.session',"
            " 'llamapy.runtime', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == []
