"""The async twins of the session primitives, the decode stream objects and their submission
rule, on the fake backend (inline runtime: the event loop's thread ticks the engine)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from session_fakes import disk_engine, open_fake

from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend
from llamapy.engine.options import EngineConfig
from llamapy.errors import CancelledError, UnsupportedFeatureError
from llamapy.runtime import Hosted, InlineRuntime, TickLoop
from llamapy.session import AsyncDecodeStream, DecodeConfig, DecodeStream, SessionConfig

PREFIX = tuple(range(2, 60))


def submitted(engine: Engine) -> object:
    return engine.stats().as_dict()["num_submitted"]


def test_every_async_twin_matches_its_blocking_twin(tmp_path: Path) -> None:
    engine = disk_engine(tmp_path)
    with open_fake(engine) as reference:
        reference.ensure_prefix(PREFIX)
        reference.prefill_suffix((9, 9))
        expected_logits = reference.next_token_logits()
        expected = [c.text for c in reference.decode(max_tokens=6, seed=3)]

    async def main() -> None:
        async with open_fake(engine) as s:
            status = await s.aensure_prefix(PREFIX)
            assert status.prefix_tokens == len(PREFIX)
            assert (await s.aprefill_suffix((9, 9))).suffix_tokens == 2
            logits = await s.anext_token_logits(timeout=5)
            assert np.array_equal(logits, expected_logits)
            snap = await s.asnapshot()
            assert await s.asave_snapshot("twin")
            async with s.adecode(max_tokens=6, seed=3) as stream:
                assert [c.text async for c in stream] == expected
            await s.arestore(snap)
            assert s.resident == [*PREFIX, 9, 9]
            await s.aensure_prefix((4, 4))
            assert await s.aload_snapshot("twin") and s.resident == [*PREFIX, 9, 9]
            assert not await s.aload_snapshot("never saved")
            with pytest.raises(UnsupportedFeatureError):
                await s.aembed("the fake host cannot embed")
        assert s.explain_context().closed

    asyncio.run(main())
    assert engine.pool.leases == {}


def test_a_stream_cancelled_before_iteration_is_never_submitted(engine: Engine) -> None:
    with open_fake(engine) as s:
        s.ensure_prefix(PREFIX)
        before = submitted(engine)
        stream = s.decode(max_tokens=4)
        assert isinstance(stream, DecodeStream) and stream.request_id is not None
        stream.cancel()
        chunks = list(stream)
        assert len(chunks) == 1 and isinstance(chunks[0].error, CancelledError)
        s.decode(max_tokens=4).close()  # made and closed: nothing runs either
        with s.decode(max_tokens=4):  # `with` entry submits
            assert submitted(engine) == before + 1

        async def dropped() -> None:
            stream = s.adecode(max_tokens=4)
            assert isinstance(stream, AsyncDecodeStream)
            stream.cancel()
            assert [c.finish_reason async for c in stream] == ["cancelled"]
            await s.adecode(max_tokens=4).aclose()

        asyncio.run(dropped())
        assert submitted(engine) == before + 1
        assert len(list(s.decode(max_tokens=3, seed=1))) >= 1  # the session is not busy


def test_decode_max_tokens_zero_generates_nothing(engine: Engine) -> None:
    with open_fake(engine) as s:
        s.ensure_prefix(PREFIX)
        chunks = list(s.decode(DecodeConfig(max_tokens=0)))
        assert all(c.error is None for c in chunks) and s.resident == list(PREFIX)


def test_runtime_acall_awaits_the_engine_without_blocking_the_loop() -> None:
    backend = FakeBackend(n_ctx=512, n_seq_max=1, n_batch=64, kv_unified=False)
    engine = Engine(backend, EngineConfig(n_parallel=1, n_batch=64, kv_unified=False))
    loop = TickLoop(lambda: Hosted(engine=engine))
    loop.ready.wait(5)
    try:
        async def main() -> None:
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0)

            other = asyncio.create_task(ticker())
            slow = await loop.acall(lambda e: (__import__("time").sleep(0.05), e.n_ctx_seq)[1])
            assert slow == 512 and ticks > 1  # the event loop ran while the tick thread worked
            with pytest.raises(KeyError):
                await loop.acall(lambda e: {}["missing"])
            other.cancel()
            assert await InlineRuntime(engine).acall(lambda e: e.n_ctx_seq) == 512

        asyncio.run(main())
    finally:
        loop.close(5)


def test_a_bad_timeout_is_refused_before_anything_runs(engine: Engine) -> None:
    from llamapy.errors import InvalidOptionError

    with open_fake(engine, config=SessionConfig(lease_timeout=0.5)) as s:
        with pytest.raises(InvalidOptionError):
            s.ensure_prefix(PREFIX, timeout=0)
        with pytest.raises(InvalidOptionError):
            s.decode(max_tokens=2, timeout=-1)
        assert s.resident == [] and s.explain_context().num_prefill_calls == 0


def test_a_stream_made_before_a_prefill_decodes_from_the_state_at_submission(
        engine: Engine) -> None:
    with open_fake(engine) as reference:
        reference.ensure_prefix(PREFIX)
        reference.prefill_suffix((9, 9))
        expected = [c.text for c in reference.decode(max_tokens=5, seed=3)]
    with open_fake(engine) as s:
        s.ensure_prefix(PREFIX)
        stream = s.decode(max_tokens=5, seed=3)  # made on PREFIX alone
        s.prefill_suffix((9, 9))  # the resident state moves before the first iteration
        assert [c.text for c in stream] == expected
        kv = engine.leases.tokens(s._lease)  # what the session says (the last sampled token's
        assert s.resident[:len(kv)] == kv and len(s.resident) - len(kv) <= 1  # KV comes next)
        assert s.resident[:len(PREFIX) + 2] == [*PREFIX, 9, 9]


def test_after_a_cancelled_adecode_the_next_reads_back_by_awaiting(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with open_fake(engine) as s:
            await s.aensure_prefix(PREFIX)
            async with s.adecode(max_tokens=8, seed=3) as stream:
                first = await stream.__anext__()
                assert first.error is None
            assert s._stale  # closed early: its tokens are read back before the next call

            def blocking() -> None:
                raise AssertionError("a blocking read-back ran on the event loop")

            monkeypatch.setattr(s, "_sync_generated", blocking)
            chunks = [c async for c in s.adecode(max_tokens=3, seed=3)]
            assert chunks and all(c.error is None for c in chunks) and not s._stale
            kv = engine.leases.tokens(s._lease)
            assert s.resident[:len(kv)] == kv and s.resident[:len(PREFIX)] == list(PREFIX)

    asyncio.run(main())
