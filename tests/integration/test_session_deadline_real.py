"""A long prefill on the real default model: a whole-call deadline interrupts it with a typed
timeout, and the session then serves the next calls, reusing the work done."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamapy.errors import CancelledError, RequestTimeoutError
from llamapy.server import Server
from llamapy.session import PrefillProgress, PrefixInput

TEXT = ("def handler(request):\n    # validate the payload, then dispatch on its kind\n"
        "    return route(request.kind, request.body)\n") * 200


@pytest.fixture(scope="module")
def long_server(model_path: Path) -> Iterator[Server]:
    """One 4096-token sequence, small chunks (a deadline lands between two of them)."""
    with Server(model_path, n_ctx=4096, n_parallel=1, n_batch=64, chunk_size=64) as s:
        s.wait_ready(60)
        yield s


def test_a_deadline_interrupts_a_3000_token_prefix_and_the_session_serves_on(
        long_server: Server) -> None:
    tokens = tuple(long_server.tokenize(TEXT)[:3000])
    assert len(tokens) == 3000
    with long_server.open_session() as s:
        seen: list[PrefillProgress] = []
        with pytest.raises(RequestTimeoutError):
            s.ensure_prefix(PrefixInput(token_ids=tokens), timeout=1.0, on_progress=seen.append)
        kept = s.resident
        assert len(kept) < 3000 and kept == list(tokens[:len(kept)])
        assert seen and seen[-1].processed_tokens <= len(kept)
        head = s.ensure_prefix(PrefixInput(token_ids=tokens[:300]))
        assert head.reused_tokens == min(300, len(kept)) > 0
        chunks = list(s.decode(max_tokens=4, temperature=0.0))
        assert chunks and all(c.error is None for c in chunks)


def test_an_async_prefill_cancelled_from_another_task_leaves_the_session_usable(
        long_server: Server) -> None:
    tokens = tuple(long_server.tokenize(TEXT)[:1500])

    async def main() -> None:
        async with long_server.open_session() as s:
            first = asyncio.Event()
            task = asyncio.create_task(s.aensure_prefix(
                tokens, on_progress=lambda p: p.processed_tokens and first.set()))
            await first.wait()
            s.cancel()
            with pytest.raises(CancelledError):
                await task
            kept = s.resident
            assert 0 < len(kept) < len(tokens) and kept == list(tokens[:len(kept)])
            status = await s.aensure_prefix(tokens[:len(kept) + 8])
            assert status.reused_tokens == len(kept) and status.warm
            text = "".join([c.text async for c in s.adecode(max_tokens=3, temperature=0.0)])
            assert isinstance(text, str)

    asyncio.run(main())


def test_a_standalone_session_opens_embeds_and_closes_from_a_coroutine(model_path: Path) -> None:
    from llamapy._native import Model
    from llamapy.session import SessionConfig, aopen_standalone

    async def main(model: Model) -> None:
        session = await aopen_standalone(model, SessionConfig(n_ctx=512))
        async with session:
            vector = await session.aembed("a stable prefix")
            assert vector.ndim == 1 and abs(float((vector ** 2).sum()) - 1.0) < 1e-3
            status = await session.aensure_prefix("def handler(request):", timeout=30)
            assert status.cold and not status.identity_changed
            logits = await session.anext_token_logits(timeout=30)
            assert logits.shape == (model.n_vocab,)
        assert session.explain_context().closed

    with Model(model_path) as model:
        asyncio.run(main(model))
