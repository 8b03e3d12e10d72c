"""``llamapy.session.open_path``: a standalone session from a model file that owns the model;
``embed_path``: a text's embedding from a model file by the native ``EmbedFunc``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy._native import Model
from llamapy.embeddings import Embedder
from llamapy.errors import ModelLoadError
from llamapy.session import (
    SessionConfig,
    SessionFactory,
    close_embedders,
    embed_func,
    embed_path,
    factory,
    open_path,
)


def test_open_path_loads_the_model_and_closing_the_session_frees_it(
        model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[Model] = []

    class Recorded(Model):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            loaded.append(self)

    monkeypatch.setattr(factory, "Model", Recorded)
    make: SessionFactory = open_path
    session = make(model_path, SessionConfig(n_ctx=512))
    try:
        status = session.ensure_prefix("The capital of France is")
        assert status.prefilled_tokens > 0
        text = "".join(chunk.text for chunk in session.decode(max_tokens=3, temperature=0.0))
        assert text
    finally:
        session.close()
    assert len(loaded) == 1 and loaded[0]._ptr is None  # freed with the session


def test_open_path_raises_for_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError):
        open_path(tmp_path / "missing.gguf")


def test_embed_path_embeds_with_the_model_file_loaded_once(
        model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[Model] = []

    class Recorded(Model):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            loads.append(self)

    monkeypatch.setattr(embed_func, "Model", Recorded)
    close_embedders()
    try:
        config = SessionConfig(n_ctx=256)
        first = embed_path(model_path, "The capital of France is Paris.", config)
        again = embed_path(str(model_path), "The capital of France is Paris.", config)
        other = embed_path(model_path, "Tomatoes are red.", config)
        assert len(loads) == 1  # kept between calls
        n_embd = loads[0].n_embd
        with Embedder(loads[0], n_ctx=256) as direct:
            expected = direct.embed("The capital of France is Paris.")
    finally:
        assert close_embedders() == 1
    assert first.shape == (n_embd,) and first.dtype == np.float32
    assert np.array_equal(first, again)
    assert np.allclose(first, expected, atol=1e-4)
    assert abs(float(np.linalg.norm(first)) - 1.0) < 1e-4
    assert float(first @ other) < 0.9999  # a different text, a different vector
    with pytest.raises(ModelLoadError):
        embed_path(model_path.parent / "missing.gguf", "text")
