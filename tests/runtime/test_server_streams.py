"""Server stream objects on the fake backend: validated at the call, submitted at the first
iteration (or ``with`` entry), cancellable before that by the stream or by id, context
managers, and bounded by their per-chunk timeout while the model loads."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator

import pytest
from server_fixtures import gated_server, submitted

from llamapy.engine.fake.text import FakeTextModel
from llamapy.engine.request import DoneEvent, TokenEvent
from llamapy.errors import (
    InvalidOptionError,
    RequestCancelledError,
    RequestTimeoutError,
    UnknownOptionError,
)
from llamapy.runtime import AsyncTextChunks, TextChunks
from llamapy.server import Server
from llamapy.server.fake import fake_server


@pytest.fixture
def server() -> Iterator[Server]:
    """Decodes of 2 ms and no end of generation but ``max_tokens`` (requests last)."""
    model = FakeTextModel("streams.gguf", eog_permille=0)
    with fake_server(n_parallel=2, n_ctx=1024, sleep_s=0.002, model=model) as s:
        s.wait_ready(10)
        yield s


def test_a_stream_is_submitted_at_its_first_iteration(server: Server) -> None:
    chunks = server.stream("hello", max_tokens=4, request_id="lazy")
    assert isinstance(chunks, TextChunks) and chunks.request_id == "lazy"
    assert submitted(server) == 0
    text = "".join(chunks)
    assert submitted(server) == 1
    assert text == server.generate("hello", max_tokens=4)


def test_with_submits_on_entry_and_cancels_on_exit(server: Server) -> None:
    with server.stream("hello", max_tokens=800) as chunks:
        assert submitted(server) == 1
        next(chunks)
    stats = server.stats()  # (the cancel reached the tick thread before this call)
    assert stats["num_cancelled"] == 1 and stats["slots_active"] == 0
    with server.events(server.tokenize("hi"), max_tokens=2) as events:
        kinds = [type(event) for event in events]
    assert kinds == [TokenEvent, TokenEvent, DoneEvent]


def test_a_stream_cancelled_before_iteration_is_never_submitted(server: Server) -> None:
    chunks = server.stream("hello", max_tokens=4)
    chunks.cancel()
    assert list(chunks) == []
    events = server.events([1, 2, 3], max_tokens=4)
    events.close()
    assert list(events) == []
    assert submitted(server) == 0


def test_server_cancel_by_id_before_iteration_never_submits(server: Server) -> None:
    chunks = server.stream_tokens([5, 6, 7], max_tokens=4)
    server.cancel(chunks.request_id)
    with pytest.raises(RequestCancelledError):
        next(chunks)
    assert list(chunks) == []  # it has ended
    server.cancel(server.stream("hi", request_id=("user", 7)))  # a stream names its id too
    dropped = server.stream("hello", max_tokens=4)
    del dropped
    gc.collect()  # a stream dropped unsubmitted leaves nothing behind
    assert submitted(server) == 0
    assert server.generate("hi", max_tokens=2, request_id=("user", 7))  # the id is free again


def test_invalid_options_raise_at_the_call(server: Server) -> None:
    with pytest.raises(UnknownOptionError):
        server.stream("hello", bogus=1)
    with pytest.raises(InvalidOptionError):
        server.stream_tokens([1, 2], max_tokens=-1)
    with pytest.raises(InvalidOptionError):
        server.astream("hello", timeout=-1)
    assert submitted(server) == 0


def test_the_per_chunk_timeout_bounds_the_wait_for_the_load(gate: threading.Event) -> None:
    with gated_server(gate) as server:
        chunks = server.stream("hello", max_tokens=2, timeout=0.2)  # returns at once
        with pytest.raises(RequestTimeoutError, match="load"):
            next(chunks)
        waiting = server.stream("hello", max_tokens=2, timeout=30)
        opener = threading.Timer(0.05, gate.set)
        opener.start()
        assert "".join(waiting) == server.generate("hello", max_tokens=2)
        opener.join()


def test_async_streams_are_lazy_objects_with_async_with(server: Server) -> None:
    async def main() -> tuple[str, list[type]]:
        chunks = server.astream("hello", max_tokens=4, request_id="a1")
        assert isinstance(chunks, AsyncTextChunks) and chunks.request_id == "a1"
        assert submitted(server) == 0
        async with chunks:
            assert submitted(server) == 1
            text = "".join([chunk async for chunk in chunks])
        async with server.aevents(server.tokenize("hi"), max_tokens=1) as events:
            kinds = [type(event) async for event in events]
        return text, kinds

    text, kinds = asyncio.run(main())
    assert text == server.generate("hello", max_tokens=4)
    assert kinds == [TokenEvent, DoneEvent]


def test_async_streams_cancelled_before_iteration_are_never_submitted(server: Server) -> None:
    async def main() -> None:
        quiet = server.astream_tokens([1, 2, 3], max_tokens=4)
        await quiet.aclose()
        assert [chunk async for chunk in quiet] == []
        revoked = server.astream("hello", max_tokens=4)
        server.cancel(revoked.request_id)
        with pytest.raises(RequestCancelledError):
            await revoked.__anext__()

    asyncio.run(main())
    assert submitted(server) == 0


def test_an_async_stream_waits_for_the_load_without_blocking(gate: threading.Event) -> None:
    async def main(server: Server) -> str:
        late = server.astream("hello", max_tokens=2, timeout=0.2)
        with pytest.raises(RequestTimeoutError, match="load"):
            await late.__anext__()
        chunks = server.astream("hello", max_tokens=2)
        first = asyncio.ensure_future(chunks.__anext__())
        await asyncio.sleep(0)
        assert not first.done()  # waiting for the load, on the loop
        gate.set()
        return await first + "".join([chunk async for chunk in chunks])

    with gated_server(gate) as server:
        assert asyncio.run(main(server)) == server.generate("hello", max_tokens=2)
