"""The runtime tests' shared fixtures: a tick loop on the fake backend, a load gate."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from test_runtime import fake_engine

from llamapy.runtime import Hosted, TickLoop


@pytest.fixture
def loop() -> Iterator[TickLoop]:
    """A ready :class:`TickLoop` hosting :func:`test_runtime.fake_engine` (closed after)."""
    runtime = TickLoop(lambda: Hosted(engine=fake_engine()), thread_name="test-tick")
    runtime.ready.wait(5)
    yield runtime
    runtime.close(5)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event a gated server's load waits on (set after the test: no loading thread is left
    behind)."""
    event = threading.Event()
    yield event
    event.set()
