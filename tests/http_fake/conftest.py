"""HTTP tests on the fake backend: the real app in-process, no model, no libllama, no socket.

``app`` is one module-wide :class:`~fake_http.FakeApp` (slot actions enabled in a temporary
folder); tests leave it idle.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_http import FakeApp, fake_app


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeApp]:
    """The app on a fresh fake server."""
    folder: Path = tmp_path_factory.mktemp("slots")
    with fake_app(slot_folder=folder) as served:
        yield served
