"""``llamapy.embeddings.Embedder`` on the real default model (small contexts)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from llamapy._native import Model
from llamapy.embeddings import Embedder
from llamapy.errors import ClosedError, ContextOverflowError, InvalidOptionError
from llamapy.session import SessionConfig, open_standalone

TEXTS = ["The cat sat on the mat.", "A kitten is sitting on a rug.",
         "Quarterly revenue grew by four percent.", "def add(a, b): return a + b",
         "Dogs are loyal animals.", "The stock market fell sharply today."]


@pytest.fixture(scope="module")
def model(model_path: Path) -> Iterator[Model]:
    with Model(model_path) as m:
        yield m


def test_batched_equals_one_by_one_across_split_decodes(model: Model) -> None:
    """n_seq_max=2 and a small n_ctx split the inputs over several decodes."""
    with Embedder(model, n_ctx=64, n_seq_max=2) as embedder:
        matrix = embedder.embed(TEXTS)
        rows = np.stack([embedder.embed(t) for t in TEXTS])
    assert matrix.shape == (len(TEXTS), model.n_embd) and matrix.dtype == np.float32
    assert np.allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)
    assert np.allclose(matrix, rows, atol=1e-5), np.abs(matrix - rows).max()
    sims = matrix @ matrix.T
    assert sims[0, 1] > max(sims[0, 2], sims[0, 3])  # cat ~ kitten, not revenue or code
    assert sims[2, 5] > max(sims[2, 0], sims[2, 3])  # revenue ~ stock market


def test_one_worker_thread_and_async(model: Model) -> None:
    with Embedder(model, n_ctx=128) as embedder:
        expected = embedder.embed(TEXTS[:3])
        results: list[np.ndarray] = []
        threads = [threading.Thread(target=lambda: results.append(embedder.embed(TEXTS[:3])))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(results) == 3 and all(np.allclose(r, expected, atol=1e-6) for r in results)
        got = asyncio.run(embedder.aembed(TEXTS[:3]))
        assert np.allclose(got, expected, atol=1e-6)
        tokens = [embedder.tokenize(t) for t in TEXTS[:3]]
        assert np.allclose(asyncio.run(embedder.aembed_tokens(tokens)), expected, atol=1e-6)
        assert embedder.embed([]).shape == (0, model.n_embd)


def test_errors(model: Model) -> None:
    embedder = Embedder(model, n_ctx=16)
    with pytest.raises(ContextOverflowError) as info:
        embedder.embed("word " * 40)
    assert (info.value.stage, info.value.n_ctx) == ("embed", 16)
    with pytest.raises(InvalidOptionError):
        embedder.embed_tokens([[]])
    with pytest.raises(InvalidOptionError):
        embedder.embed([1, 2])  # type: ignore[list-item]
    embedder.close()
    embedder.close()
    with pytest.raises(ClosedError):
        embedder.embed("closed")


def test_standalone_session_embeds(model: Model) -> None:
    with open_standalone(model, SessionConfig(n_ctx=256, n_batch=64)) as s:
        assert np.isclose(float(np.linalg.norm(s.embed("hello"))), 1.0, atol=1e-5)
