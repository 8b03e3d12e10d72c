"""Fixtures for tests of the Server (and layers above it) on the real default model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llamapy.models import default_model_path
from llamapy.server import Server


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default model; `python -m llamapy.models fetch` (run by .ci/run) provides it."""
    return default_model_path()


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[Server]:
    """A shared 4-slot server (tests must leave it idle)."""
    with Server(model_path, n_ctx=4096, n_parallel=4, n_batch=512, chunk_size=256) as s:
        s.wait_ready(60)
        yield s
