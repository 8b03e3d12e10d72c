"""Reranking through the generation engine, on the tiny BERT reranker (no KV memory: an
encoder-only model).

The pairs of concurrent rerank calls share the engine's decodes, each pair whole, and the
scores are those of each pair decoded alone on a separate embeddings context. The weights are
arbitrary (see ``llamapy.testing.tiny_reranker_path``): these tests prove batching,
scheduling, cancellation and bounds, not relevance.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from llamapy._native import Model
from llamapy.embeddings import RANK, Embedder, rerank_tokens
from llamapy.errors import ContextOverflowError, RequestTimeoutError, UnsupportedFeatureError
from llamapy.server import Server
from llamapy.testing import tiny_reranker_path

QUERY = "machine learning is"
#: Documents whose pairs score far apart (0.001 to 0.041, each 0.0019 or more from the
#: others) under these weights: a score identifies its pair.
DOCS = ["a", "b c d e f g", "paris is a city", "the the the the the the the the the the",
        "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20", "machine learning is a field"]
#: How far a pair's score moves with the batch it is decoded in (the kernels' summation
#: order depends on the batch's size: up to 4e-5 seen), well under the scores' spacing.
TOL = 2e-4


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server(tiny_reranker_path(), n_ctx=2048, n_parallel=4, pooling_type=RANK) as srv:
        srv.wait_ready(60)
        yield srv


@pytest.fixture(scope="module")
def pairs() -> list[list[int]]:
    model = Model(tiny_reranker_path())
    return [rerank_tokens(model, QUERY, doc) for doc in DOCS]


@pytest.fixture(scope="module")
def alone(pairs: list[list[int]]) -> list[float]:
    """Each pair's score decoded alone on an embeddings context of its own."""
    with Embedder(Model(tiny_reranker_path()), n_ctx=512, pooling=RANK) as embedder:
        scores = [embedder.score_tokens([pair])[0] for pair in pairs]
    spaced = sorted(scores)
    assert min(b - a for a, b in itertools.pairwise(spaced)) > 5 * TOL
    return scores


def _decodes(server: Server) -> int:
    return int(server.stats()["num_decode_calls"])


def test_concurrent_calls_share_decodes_and_score_as_alone(server: Server,
                                                           pairs: list[list[int]],
                                                           alone: list[float]) -> None:
    before = _decodes(server)

    async def both() -> list[list[float]]:
        return list(await asyncio.gather(server.ascore_tokens(pairs[:3]),
                                         server.ascore_tokens(pairs[3:])))

    first, second = asyncio.run(both())
    assert first + second == pytest.approx(alone, abs=TOL)
    # 6 pairs on 4 slots: at least 2 decodes, and fewer than one per pair
    assert 2 <= _decodes(server) - before < len(pairs)
    assert server.score_tokens(pairs[::-1]) == pytest.approx(alone[::-1], abs=TOL)


def test_a_call_of_many_inputs_holds_no_more_than_the_slots(server: Server,
                                                           pairs: list[list[int]]) -> None:
    many = pairs * 40  # 240 inputs; the queue takes 64: a call keeps 4 in the engine
    scores = server.score_tokens(many)
    assert len(scores) == 240 and scores[:6] == pytest.approx(scores[6:12], abs=TOL)
    assert server.stats()["queue_depth"] == 0


def test_cancelling_a_call_frees_its_slots_and_the_next_call_runs(server: Server,
                                                                 pairs: list[list[int]],
                                                                 alone: list[float]) -> None:
    async def cancelled() -> None:
        task = asyncio.ensure_future(server.ascore_tokens(pairs * 200))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert server.score_tokens(pairs) == pytest.approx(alone, abs=TOL)
    stats = server.stats()
    assert stats["queue_depth"] == 0
    assert all(slot["state"] == "idle" for slot in stats["slots"])


def test_what_the_ranking_engine_refuses(server: Server, pairs: list[list[int]]) -> None:
    with pytest.raises(ContextOverflowError):  # past one physical batch (512)
        server.score_tokens([pairs[0], [pairs[0][0]] * 600])
    with pytest.raises(UnsupportedFeatureError):  # it generates nothing
        server.complete_tokens(pairs[0], max_tokens=2)
    assert server.max_pooled_tokens == 512
    assert server.score_tokens([]) == []
    with pytest.raises(RequestTimeoutError):  # (what was in flight is cancelled)
        server.score_tokens(pairs * 100, timeout=0.0005)
    assert server.stats()["queue_depth"] == 0
