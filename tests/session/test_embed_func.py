"""``embed_path`` dispatches to the registered ``EmbedFunc``; registering returns the previous
one, None restores the native default, and bad arguments are typed errors before any model
loads. (The native function on a real model: tests/integration/test_session_factory.py.)"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from llamapy.errors import UnsupportedFeatureError
from llamapy.session import (
    EmbedFunc,
    SessionConfig,
    embed_path,
    native_embed,
    register_embed_func,
)


@pytest.fixture(autouse=True)
def restore_default() -> Iterator[None]:
    yield
    register_embed_func(None)


def test_embed_path_calls_the_registered_function() -> None:
    calls: list[tuple[str, str, SessionConfig | None]] = []

    def fake(model_path: str | os.PathLike[str], text: str,
             config: SessionConfig | None = None) -> np.ndarray:
        calls.append((os.fspath(model_path), text, config))
        return np.full(3, len(text), dtype=np.float32)

    func: EmbedFunc = fake
    assert register_embed_func(func) is native_embed
    config = SessionConfig(n_ctx=64)
    assert embed_path("m.gguf", "four", config).tolist() == [4.0, 4.0, 4.0]
    assert calls == [("m.gguf", "four", config)]
    assert register_embed_func(None) is fake  # the previous one, to put back
    assert register_embed_func(None) is native_embed


def test_bad_arguments_are_typed_errors_before_anything_loads(tmp_path: object) -> None:
    with pytest.raises(TypeError):
        register_embed_func("not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        embed_path("m.gguf", ["a list"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        embed_path("m.gguf", "text", {"n_ctx": 64})  # type: ignore[arg-type]
    with pytest.raises(UnsupportedFeatureError):
        native_embed("never-loaded.gguf", "text", SessionConfig(adapters=("a.gguf",)))
