"""Fixtures for tests on the real default model (SmolLM2-135M-Instruct Q4_1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llamapy.models import default_model_path


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default model; `python -m llamapy.models fetch` (run by .ci/run) provides it."""
    return default_model_path()


@pytest.fixture(scope="session")
def model(model_path: Path) -> Iterator[object]:
    from llamapy._native import Model

    with Model(model_path) as m:
        yield m
