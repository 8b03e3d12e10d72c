"""Fixtures for the session tests on the fake backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from session_fakes import make_engine, open_fake

from llamapy.engine.engine import Engine
from llamapy.session import Session


@pytest.fixture
def engine() -> Engine:
    """A two-slot fake engine, n_ctx 512 per sequence."""
    return make_engine()


@pytest.fixture
def session_factory(engine: Engine) -> Callable[..., Session]:
    """Open sessions on the shared fake engine."""
    return lambda **kw: open_fake(engine, **kw)
