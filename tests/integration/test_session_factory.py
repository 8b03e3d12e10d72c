"""``llamapy.session.open_path``: a standalone session from a model file that owns the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamapy._native import Model
from llamapy.errors import ModelLoadError
from llamapy.session import SessionConfig, SessionFactory, factory, open_path


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
