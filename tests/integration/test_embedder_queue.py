"""The embedder's work is bounded and cancellable (the tiny reranker of ``llamapy.testing``:
a real model that decodes in milliseconds): at most ``max_pending`` calls wait, a cancelled
call that waits never runs, and one that runs stops before its next decode."""

from __future__ import annotations

import asyncio
import threading

import pytest

from llamapy._native import Context, Model
from llamapy.embeddings import RANK, Embedder, rerank_tokens
from llamapy.errors import ClosedError, QueueFullError
from llamapy.testing import tiny_reranker_path


@pytest.fixture(scope="module")
def model() -> Model:
    return Model(tiny_reranker_path())


def test_past_max_pending_a_call_is_refused_at_once(model: Model) -> None:
    gate = threading.Event()
    with Embedder(model, pooling=RANK, max_pending=1) as embedder:
        running = embedder._submit(lambda cancel: gate.wait(10))  # holds the worker
        waiting = embedder._submit(lambda cancel: True)  # the one that may wait
        with pytest.raises(QueueFullError):
            embedder.score_tokens([rerank_tokens(model, "q", "a")])
        gate.set()
        assert running[0].result(10) and waiting[0].result(10)
        assert len(embedder.score_tokens([rerank_tokens(model, "q", "a")])) == 1


def test_a_cancelled_call_stops_before_its_next_decode(model: Model,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    decodes: list[int] = []
    first = threading.Event()
    original = Context.decode

    def counting(self: Context, batch: object) -> None:
        decodes.append(1)
        first.set()
        original(self, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(Context, "decode", counting)
    pairs = [rerank_tokens(model, "machine learning", "a machine " * 200)] * 2000  # decodes

    async def run(embedder: Embedder) -> None:
        task = asyncio.ensure_future(embedder.ascore_tokens(pairs))
        await asyncio.to_thread(first.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(await embedder.ascore_tokens(pairs[:1])) == 1  # the worker is free again

    with Embedder(model, pooling=RANK) as embedder:
        asyncio.run(run(embedder))
    assert len(decodes) < 1000, len(decodes)  # 2001 had the cancelled call run to its end


def test_a_cancelled_call_that_waits_never_runs(model: Model) -> None:
    gate = threading.Event()
    ran = threading.Event()

    async def run(embedder: Embedder) -> None:
        embedder._submit(lambda cancel: gate.wait(10))
        task = asyncio.ensure_future(embedder._arun(lambda cancel: ran.set()))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        await embedder._arun(lambda cancel: None)

    with Embedder(model, pooling=RANK) as embedder:
        asyncio.run(run(embedder))
    assert not ran.is_set()


def test_no_call_is_taken_after_close(model: Model) -> None:
    embedder = Embedder(model, pooling=RANK)
    assert len(embedder.score_tokens([rerank_tokens(model, "q", "a")])) == 1
    embedder.close()
    with pytest.raises(ClosedError):
        embedder.score_tokens([rerank_tokens(model, "q", "a")])
    assert embedder._ctx is None and embedder._jobs == 0
